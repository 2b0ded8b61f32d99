"""The conversion job: plan, run shards in parallel, then write manifest and report.

``run_job`` is the whole of ``python -m convert SRC OUT``. Its parts live
beside it: ``outdir`` (refusing a wrong OUT, its lock), ``plan`` (which video
goes to which shard), ``rerun`` (what an OUT written before holds and what to
run again), ``space`` (the free-space advice), ``schedule`` (the shards on
joblib or Dask), ``supervise`` and ``shard_worker`` (one shard's processes),
``progress`` (the bar) and ``finalize`` (report and manifest, written last, so
a manifest's presence means the job is complete).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from ..format import MANIFEST, PLAN, SHARD_DIR, FormatError, read_manifest, shard_name
from ..format.errors import storing
from ..format.layout import write_json_atomic
from ..format.system import cpu_count
from ..options import JobOptions
from ..worker.plan import ConvertConfig, Plan, PlanError, admit, check_same, default_shards, load_plan, make_plan
from ..worker.sources import Source, load_source
from .finalize import finalize
from .outdir import check_out, hold_out
from .progress import ProgressBar
from .rerun import HeldRecords, failed_videos, kept_summaries, new_videos, read_source_again, shards_to_repair
from .schedule import run_shards
from .space import SpaceCheck, pending_videos
from .supervise import prestart

# Seconds the end of a job waits for a space check still probing: it has had the whole conversion, and
# its advice is moot once the shards are written.
SPACE_WAIT = 10.0


def prepare(src: str, out: str, config: ConvertConfig, opts: JobOptions, *, videos: str | None = None,
            split: str | None = None, classes_file: str | None = None, source: Source | None = None,
            staging_of: str | None = None) -> Plan:
    """Check arguments, read the source (unless given) and write (or reuse) the plan. ``staging_of``: the URL
    whose staging folder ``out`` is (errors then advise another ``--staging`` folder, not another OUT)."""
    check_out(out, config, staging_of=staging_of)
    source_info = {"path": os.path.abspath(src), "videos": os.path.abspath(videos) if videos else None,
                   "split": split}
    existing = load_plan(out, staging_of=staging_of) if os.path.isdir(out) else None
    if existing is not None:
        check_same(existing, config, source_info, out, staging_of=staging_of)
        return existing
    if source is None:
        source = admit(load_source(src, videos=videos, split=split, classes_file=classes_file), config.backend)
    source_info["kind"] = source.kind
    workers = opts.workers or cpu_count()
    n_shards = opts.shards or default_shards(len(source.items), workers)
    plan = make_plan(source, config, n_shards, source_info)
    with storing("creating", os.path.join(out, SHARD_DIR)):
        os.makedirs(os.path.join(out, SHARD_DIR), exist_ok=True)
    write_json_atomic(os.path.join(out, PLAN), plan.to_dict(), indent=1)
    return plan



def run_job(src: str, out: str, config: ConvertConfig, opts: JobOptions, *, videos: str | None = None,
            split: str | None = None, classes_file: str | None = None, add_new: bool = False,
            retry_failed: bool = False, say: Callable[[str], None] | None = None,
            staging_of: str | None = None) -> dict:
    """Convert ``src`` into shards under ``out``; returns the manifest (plus timing and notes).

    One job at a time per OUT: a second one raises PlanError naming the first.
    On a finished OUT, shards that have gone missing are converted again (the
    others are not touched) and the manifest is rewritten. Videos the source
    holds but the plan lacks are counted, and with ``add_new`` converted into
    new shards. ``retry_failed`` converts again the videos recorded as failed
    (finished or not). ``say`` receives one-line notes about all of this.
    ``staging_of``: the URL whose local staging folder ``out`` is; an OUT
    that cannot take the job then advises another ``--staging`` folder.
    """
    say = say or (lambda message: None)
    source_kw = {"videos": videos, "split": split, "classes_file": classes_file}
    check_out(out, config, staging_of=staging_of)  # before OUT or its lock file is created
    if not opts.dask:
        prestart()  # the shard processes' fork server imports while the source is read and planned
    source = None
    rerun = os.path.exists(os.path.join(out, PLAN))
    if not rerun:
        # Read the source before creating OUT, so a bad source leaves nothing behind.
        source = admit(load_source(src, **source_kw), config.backend)
    with hold_out(out, staging_of=staging_of):
        plan = prepare(src, out, config, opts, source=source, staging_of=staging_of, **source_kw)
        if rerun:
            source = read_source_again(src, out, add_new, say, **source_kw)
            source = admit(source, config.backend) if source is not None else None
        manifest_path = os.path.join(out, MANIFEST)
        finished = os.path.exists(manifest_path)
        notes: dict = {}
        held = HeldRecords(out=out, plan=plan)
        redo: set[int] | None = None  # None: every shard (an unfinished job)
        manifest = None
        if finished:
            try:
                manifest = read_manifest(out)
            except FormatError as exc:
                raise PlanError(f"{exc}; move it aside to finish the conversion again") from None
            redo = shards_to_repair(out, plan, manifest, notes, say, held)
        if rerun and source is not None:
            added = new_videos(out, plan, source, opts, add_new, notes, say, staging_of=staging_of)
            if redo is not None:
                redo |= added
        retry = failed_videos(out, plan, held=held) if retry_failed else {}
        if retry_failed:
            notes["retried"] = sum(len(v) for v in retry.values())
            say(f"{out}: retrying {notes['retried']} video(s) recorded as failed, in {len(retry)} shard(s)")
            if redo is not None:
                redo |= set(retry)
        if manifest is not None:
            if not redo:
                return {**manifest.to_dict(), **notes, "already_complete": True, "seconds": 0.0,
                        "converted": {"videos": 0, "clips": 0}}
            kept = kept_summaries(plan, manifest, redo)
            # From here until the new manifest, OUT is an unfinished job: a kill
            # leaves it for a plain rerun to complete, never a stale manifest.
            with storing("removing", manifest_path):
                os.remove(manifest_path)
        else:
            kept = []
        running = range(len(plan.shards)) if redo is None else sorted(redo)
        total = sum(len(plan.shards[i]) for i in running)
        space = SpaceCheck(out=out, plan=plan, pending=pending_videos(plan, running, held), say=say,
                           timeout=opts.shard.video_timeout)
        space.start()
        t0 = time.monotonic()
        bar = ProgressBar(out, total, opts.progress, None if redo is None else {shard_name(i) for i in redo},
                          every=opts.progress_every)
        bar.start()
        try:
            summaries = run_shards(out, plan, opts, redo, retry)
        except BaseException:
            space.finish(0)  # a failed job does not wait for its advice: the probe process is killed
            raise
        finally:
            bar.stop.set()
            bar.join()
        # Its warning said before the job's result, unless it is still probing when the shards are done.
        space.finish(SPACE_WAIT)
        for s in summaries:
            if s.get("note"):
                notes.setdefault("set_aside", []).append(s["note"])
                say(s["note"])
        written = finalize(out, plan, kept + summaries)
        converted = {"videos": sum(s["new_videos"] for s in summaries), "clips": sum(s["new_clips"] for s in summaries)}
        return {**written.to_dict(), **notes, "already_complete": False, "seconds": time.monotonic() - t0,
                "converted": converted}


__all__ = ["JobOptions", "prepare", "run_job"]
