"""The conversion job: plan, run shards in parallel, then write manifest and report.

Shards run through joblib: one supervisor thread per shard watching its
shard process, as many at a time as workers (joblib's threading backend), or
on several machines through joblib's Dask backend. The manifest is written
last, from what the shards hold, so its presence means the job is complete.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import socket
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Callable, Iterable, Iterator

from .format import (FORMAT_NAME, FORMAT_VERSION, LOCK, MANIFEST, PLAN, PROGRESS_DIR, REPORT, SHARD_DIR, FormatError,
                     ShardMissing, get_backend, shard_name)
from .plan import (ConvertConfig, Plan, PlanError, add_shards, check_same, default_shards, load_plan, make_plan,
                   write_json_atomic)
from .sources import Source, SourceError, VideoItem, load_source
from .supervise import ShardOptions, prestart, run_shard
from .system import cpu_count



@dataclass(frozen=True)
class JobOptions:
    """How to run (not what to produce): parallelism, timeouts, shard count."""

    workers: int = 0  # 0: every core
    shards: int | None = None
    shard: ShardOptions = ShardOptions()
    dask: str | None = None  # scheduler address, or "local" for a LocalCluster
    progress: bool = True


def check_out(out: str, config: ConvertConfig) -> None:
    """Refuse an OUT that holds something else, before any work."""
    if not os.path.exists(out):
        return
    if not os.path.isdir(out):
        raise PlanError(f"{out}: exists and is not a directory")
    manifest = os.path.join(out, MANIFEST)
    if os.path.exists(manifest):
        with open(manifest) as fh:
            m = json.load(fh)
        if m.get("format") != FORMAT_NAME:
            raise PlanError(f"{out}: holds a {m.get('format')!r} dataset, not {FORMAT_NAME}; use another OUT")
        if m.get("backend") != config.backend:
            raise PlanError(f"{out}: holds {m.get('backend')} shards, asked for {config.backend}; use another OUT")
    elif not os.path.exists(os.path.join(out, PLAN)) and not os.path.exists(os.path.join(out, LOCK)) \
            and os.listdir(out):
        # A lock file without a plan: a job that started here and has not written its plan yet.
        raise PlanError(f"{out}: not empty and holds no conversion; use an empty or new folder")


def _holder(path: str) -> str:
    """Who holds the lock, as its JSON says; the holder may be a moment away from writing it."""
    for _ in range(20):
        with contextlib.suppress(OSError, ValueError), open(path) as fh:
            who = json.load(fh)
            return f"host {who['host']}, pid {who['pid']}, since {who['started']}"
        time.sleep(0.1)
    return "holder unknown"


@contextlib.contextmanager
def hold_out(out: str) -> Iterator[None]:
    """Hold OUT's exclusive lock for the job's lifetime, or raise PlanError naming the holder.

    flock belongs to the open file, so the kernel releases it when the holding
    process dies however it dies (kill -9 included): a stale lock file is simply
    taken over by the next job. The file is never deleted, because a job that
    opened it just before a delete would lock an inode no one else sees.
    """
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, LOCK)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise PlanError(f"{out}: another conversion is writing it ({_holder(path)}); "
                            f"wait for it to end, or use another OUT") from None
        who = {"host": socket.gethostname(), "pid": os.getpid(),
               "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(who).encode(), 0)
        yield
    finally:
        os.close(fd)


def prepare(src: str, out: str, config: ConvertConfig, opts: JobOptions, *, videos: str | None = None,
            split: str | None = None, classes_file: str | None = None, source: Source | None = None) -> Plan:
    """Check arguments, read the source (unless given) and write (or reuse) the plan."""
    check_out(out, config)
    source_info = {"path": os.path.abspath(src), "videos": os.path.abspath(videos) if videos else None,
                   "split": split}
    existing = load_plan(out) if os.path.isdir(out) else None
    if existing is not None:
        check_same(existing, config, source_info, out)
        return existing
    if source is None:
        source = load_source(src, videos=videos, split=split, classes_file=classes_file)
    source_info["kind"] = source.kind
    workers = opts.workers or cpu_count()
    n_shards = opts.shards or default_shards(len(source.items), workers)
    plan = make_plan(source, config, n_shards, source_info)
    os.makedirs(os.path.join(out, SHARD_DIR), exist_ok=True)
    write_json_atomic(os.path.join(out, PLAN), plan.to_dict())
    return plan


class _ProgressBar(threading.Thread):
    """Polls the shards' progress files and drives one tqdm bar in the parent."""

    def __init__(self, out: str, total: int, enabled: bool, shards: set[str] | None = None) -> None:
        super().__init__(daemon=True)
        self.dir = os.path.join(out, PROGRESS_DIR)
        self.total, self.enabled = total, enabled
        self.shards = shards  # None: every shard's file; else only these shards run now
        self.stop = threading.Event()

    def _read(self) -> dict:
        agg: Counter = Counter()
        if os.path.isdir(self.dir):
            for name in os.listdir(self.dir):
                if name.endswith(".json") and (self.shards is None or name[:-5] in self.shards):
                    with contextlib.suppress(OSError, ValueError), open(os.path.join(self.dir, name)) as fh:
                        agg.update(json.load(fh))
        return agg

    def run(self) -> None:
        if not self.enabled:
            return
        from tqdm import tqdm

        start = time.monotonic()
        with tqdm(total=self.total, unit="video", dynamic_ncols=True) as bar:
            while True:
                stopping = self.stop.wait(0.5)
                state = self._read()
                bar.n = min(state.get("done", 0), self.total)
                rate = state.get("clips", 0) / max(time.monotonic() - start, 1e-9)
                bar.set_postfix_str(f"{state.get('clips', 0)} clips, {rate:.1f} clips/s", refresh=False)
                bar.refresh()
                if stopping:
                    return


SIZE_SAMPLE = 64  # videos per shard whose file size is read to weigh it


def _source_bytes(items: list) -> float:
    """A shard's decoding work, roughly: its videos' file sizes (a sample of them, scaled to all)."""
    if not items:
        return 0.0
    sample = items[::max(1, len(items) // SIZE_SAMPLE)][:SIZE_SAMPLE]
    sizes = []
    for item in sample:
        try:
            sizes.append(os.stat(item.path).st_size)
        except OSError:
            sizes.append(0)  # missing or unreadable: the shard records why, at no decoding cost
    return sum(sizes) / len(sizes) * len(items)


def run_shards(out: str, plan: Plan, opts: JobOptions, indices: Iterable[int] | None = None,
               retry: dict[int, list[int]] | None = None) -> list[dict]:
    """Run the shards ``indices`` (default: all of the plan); their summaries, in any order.

    ``retry`` maps a shard to the videos it converts again despite their records.
    """
    workers = opts.workers or cpu_count()
    indices = range(len(plan.shards)) if indices is None else sorted(indices)
    if len(indices) > workers:
        # Longest first: a worker that draws a short shard last does not leave
        # the others waiting on a long one. On 200 videos in 4 shards on 2
        # cores the plan's order left one core idle for 1.0-1.1 s at the end
        # of an 11 s job; by file size, 0-0.3 s.
        weight = {i: _source_bytes(plan.shards[i]) for i in indices}
        indices = sorted(indices, key=lambda i: -weight[i])
    retry = retry or {}
    # joblib schedules the shards on every machine: its threading backend here
    # (a supervisor only waits on its shard process's pipe; the decoding runs
    # in the shard processes, one per core), its Dask backend on a cluster.
    # Importing joblib costs about 0.1 s of a job's start-up, which is why it
    # is imported here and not with the module.
    from joblib import Parallel, delayed, parallel_config

    tasks = [delayed(run_shard)(out, i, len(plan.shards[i]), opts.shard, retry.get(i, ())) for i in indices]
    if opts.dask:
        from dask.distributed import Client, LocalCluster

        cluster = LocalCluster(n_workers=workers, threads_per_worker=1) if opts.dask == "local" else None
        with Client(cluster or opts.dask), parallel_config(backend="dask"):
            results = list(Parallel(return_as="generator_unordered")(tasks))
        if cluster is not None:
            cluster.close()
        return results
    return list(Parallel(n_jobs=min(workers, len(tasks)), backend="threading", return_as="generator_unordered")(tasks))


# A shard summary's fields that its manifest entry keeps ("files": TFRecord shards only).
SUMMARY_KEYS = ("videos", "clips", "value_bytes", "sha256", "files")


def finalize(out: str, plan: Plan, summaries: list[dict]) -> dict:
    """Write report.jsonl and, last, manifest.json from what the shards hold."""
    backend = get_backend(plan.config.backend)
    statuses: Counter = Counter()
    records = [asdict(p) for p in plan.problems]
    statuses.update(p.status for p in plan.problems)
    shards = []
    for s in sorted(summaries, key=lambda s: s["index"]):
        name = plan.shard_path(out, s["index"])
        reader = backend.reader(name)
        try:
            shard_records = reader.records()
        finally:
            reader.close()
        for rec in shard_records:
            statuses[rec.status] += 1
            if rec.status != "ok":
                records.append({"id": rec.video_id, "path": rec.path, "status": rec.status, "reason": rec.reason})
        entry = {"name": os.path.basename(name), "path": os.path.relpath(name, out), "index": s["index"]}
        entry.update({k: s[k] for k in SUMMARY_KEYS if k in s})
        shards.append(entry)
    tmp = os.path.join(out, REPORT + ".tmp")
    with open(tmp, "w") as fh:
        for r in sorted(records, key=lambda r: r["id"]):
            fh.write(json.dumps(r, sort_keys=True) + "\n")
    os.replace(tmp, os.path.join(out, REPORT))
    cfg = plan.config
    manifest = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        **cfg.data_spec(plan.classes),
        "num_classes": len(plan.classes),
        "shards": shards,
        "totals": {"videos": sum(s["videos"] for s in shards), "clips": sum(s["clips"] for s in shards),
                   "value_bytes": sum(s["value_bytes"] for s in shards)},
        "status_counts": dict(sorted(statuses.items())),
        "source": plan.source,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    write_json_atomic(os.path.join(out, MANIFEST), manifest)
    return manifest


def _records(out: str, plan: Plan, index: int) -> list | None:
    """The done records shard ``index`` holds; None when its folder or data file is gone."""
    path = plan.shard_path(out, index)
    try:
        reader = get_backend(plan.config.backend).reader(path)
        try:
            return reader.records()
        finally:
            reader.close()
    except ShardMissing:
        return None
    except FormatError as exc:
        raise PlanError(f"{path}: cannot be read ({exc}); see python -m convert verify {out}") from exc


class HeldRecords:
    """The done records of each shard, read at most once per run.

    A rerun asks for them up to three times before its shards start (missing
    shards, ``--retry-failed``, the space estimate); reading a shard's records
    means scanning its LMDB keys or parsing its TFRecord commit files, so each
    shard is read once and the answer (records, None for a missing shard, or
    the PlanError of a damaged one) is kept. Valid until the shards run.
    """

    def __init__(self, *, out: str, plan: Plan) -> None:
        self.out, self.plan = out, plan
        self._got: dict[int, list | None | PlanError] = {}

    def __call__(self, index: int) -> list | None:
        if index not in self._got:
            try:
                self._got[index] = _records(self.out, self.plan, index)
            except PlanError as exc:
                self._got[index] = exc
        got = self._got[index]
        if isinstance(got, PlanError):
            raise got
        return got


def _missing_shards(plan: Plan, held: HeldRecords) -> list[int]:
    """Shards of the plan whose folder or data file is gone (say, deleted after the job finished)."""
    return [i for i in range(len(plan.shards)) if held(i) is None]


def failed_videos(out: str, plan: Plan, *, held: HeldRecords | None = None) -> dict[int, list[int]]:
    """Per shard, the plan indices of the videos its records say ``failed``; shards with none are left out."""
    held = held or HeldRecords(out=out, plan=plan)
    found = {}
    for i, items in enumerate(plan.shards):
        failed = {r.video_id for r in held(i) or () if r.status == "failed"}
        if failed:
            found[i] = [k for k, item in enumerate(items) if item.id in failed]
    return found


def _kept_summaries(plan: Plan, manifest: dict, redo: set[int]) -> list[dict]:
    """The manifest's entries for the shards that are not run again, as run_shard returns them."""
    by_name = {s["name"]: s for s in manifest["shards"]}
    return [{"index": i, **{k: v for k, v in by_name[shard_name(i)].items() if k in SUMMARY_KEYS}}
            for i in range(len(plan.shards)) if i not in redo]


def _shards_to_repair(out: str, plan: Plan, manifest: dict, notes: dict, say: Callable[[str], None],
                      held: HeldRecords) -> set[int]:
    """Shards of a finished OUT to run again: gone from disk, or absent from the manifest."""
    listed = {s["name"] for s in manifest["shards"]}
    missing = _missing_shards(plan, held)
    unlisted = [i for i in range(len(plan.shards)) if shard_name(i) not in listed and i not in missing]
    if missing:
        notes["missing_shards"] = [shard_name(i) for i in missing]
        say(f"{out}: {len(missing)} shard(s) missing ({', '.join(notes['missing_shards'])}); "
            f"converting them again, the other shards are kept as they are")
    if unlisted:
        notes["unlisted_shards"] = [shard_name(i) for i in unlisted]
        say(f"{out}: {len(unlisted)} shard(s) not in the manifest ({', '.join(notes['unlisted_shards'])}); "
            f"finishing them")
    return set(missing) | set(unlisted)


def _new_videos(out: str, plan: Plan, source: Source, opts: JobOptions, add_new: bool, notes: dict,
                say: Callable[[str], None]) -> set[int]:
    """Count the source's videos the plan lacks; with ``add_new``, append them as new shards (their indices)."""
    planned = {it.id for shard in plan.shards for it in shard}
    new = sum(it.id not in planned for it in source.items)
    if not new:
        return set()
    if not add_new:
        notes["new_in_source"] = new
        say(f"{out}: {new} video(s) in the source are not in the plan; rerun with --add-new "
            f"to convert them into new shards")
        return set()
    first = len(plan.shards)
    try:
        add_shards(plan, source, opts.shards or default_shards(new, opts.workers or cpu_count()))
    except PlanError as exc:
        raise PlanError(f"{out}: {exc}") from None
    write_json_atomic(os.path.join(out, PLAN), plan.to_dict())
    notes["added_videos"] = new
    say(f"{out}: adding {new} new video(s) as {len(plan.shards) - first} new shard(s), "
        f"{shard_name(first)} to {shard_name(len(plan.shards) - 1)}; the other shards are kept")
    return set(range(first, len(plan.shards)))


def _read_source_again(src: str, out: str, required: bool, say: Callable[[str], None], **source_kw
                       ) -> Source | None:
    """The source as it is now (a rerun looks for videos added since the plan); None if unreadable and not required."""
    try:
        return load_source(src, **source_kw)
    except (SourceError, OSError) as exc:
        if required:
            raise
        say(f"{out}: cannot read the source to look for new videos ({exc}); going on with the plan")
        return None


SPACE_SAMPLE = 16  # videos probed to estimate the space a job needs


def pending_videos(plan: Plan, shards: Iterable[int], held: HeldRecords) -> list[VideoItem]:
    """The videos of ``shards`` that this run will convert (those their shards hold no record of)."""
    pending = []
    for i in shards:
        try:
            done = {r.video_id for r in held(i) or ()}
        except PlanError:
            done = set()  # a damaged shard: its process sets it aside and converts it all again
        pending += [item for item in plan.shards[i] if item.id not in done]
    return pending


def _estimate(plan: Plan, pending: list[VideoItem]) -> int | None:
    """Bytes ``pending`` will take, from up to SPACE_SAMPLE probed videos; None if none probes."""
    from .decode import VideoDecoder, VideoError
    from .format import get_codec
    from .shard_worker import estimate_bytes

    if not pending:
        return 0
    step = max(1, len(pending) // SPACE_SAMPLE)
    sizes = []
    for item in pending[::step][:SPACE_SAMPLE]:
        try:
            with VideoDecoder(item.path, plan.config.frame_spec()) as dec:
                sizes.append(estimate_bytes(dec, plan.config))
        except VideoError:
            continue  # the conversion records why; it adds nothing to the estimate
    if not sizes:
        return None
    # Raw bytes; lz4 and jpeg store less (FORMAT.md), so this is an upper bound for them.
    ratio = {"raw": 1.0, "lz4": 1.2, "jpeg": 8.0}.get(get_codec(plan.config.codec).name, 1.0)
    return int(sum(sizes) / len(sizes) * len(pending) / ratio)


def estimate_bytes_needed(out: str, plan: Plan, shards: Iterable[int], *,
                          held: HeldRecords | None = None) -> int | None:
    """Bytes the pending videos of ``shards`` will take, from a few probed videos; None if none probes.

    A sample, not every video: probing reads each container's header, and a
    Kinetics job has 240k of them.
    """
    return _estimate(plan, pending_videos(plan, shards, held or HeldRecords(out=out, plan=plan)))


def _warn_if_short(out: str, plan: Plan, pending: list[VideoItem], say: Callable[[str], None]) -> None:
    need = _estimate(plan, pending)
    free = shutil.disk_usage(out).free
    if need and need > free:
        say(f"{out}: this run needs about {_human(need)} (estimated from up to {SPACE_SAMPLE} probed videos) "
            f"but the device has {_human(free)} free; it stops cleanly when the disk fills, and a rerun after "
            f"freeing space goes on from there")


class SpaceCheck(threading.Thread):
    """Warns (through ``say``) when OUT's device looks too small for ``pending``; runs beside the shards.

    Probing imports PyAV into the job process and opens up to SPACE_SAMPLE
    videos, time the shard processes waited when it ran before them (median
    ``run_job`` on one tiny local video 0.314 -> 0.281 s in a thread; on
    network storage, 16 container opens). The warning is only advice (a full
    disk stops the job cleanly anyway), so it may come a moment after the
    shards start. The pending videos are listed before the shards start
    writing, from the records read already; the thread only probes files and
    asks the device for its free space. ``run()`` called directly checks in
    the caller's thread. A probe that fails unexpectedly is said, not raised.
    """

    def __init__(self, *, out: str, plan: Plan, pending: list[VideoItem], say: Callable[[str], None]) -> None:
        super().__init__(name="convert-space-check", daemon=True)
        self.out, self.plan, self.pending, self.say = out, plan, pending, say

    def run(self) -> None:
        try:
            _warn_if_short(self.out, self.plan, self.pending, self.say)
        except Exception as exc:  # noqa: BLE001 - advice only: the conversion goes on without it
            self.say(f"{self.out}: could not estimate the space this run needs ({type(exc).__name__}: {exc})")


def _human(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 1 << 30 else f"{n / 2**20:.0f} MiB"


def run_job(src: str, out: str, config: ConvertConfig, opts: JobOptions, *, videos: str | None = None,
            split: str | None = None, classes_file: str | None = None, add_new: bool = False,
            retry_failed: bool = False, say: Callable[[str], None] | None = None) -> dict:
    """Convert ``src`` into shards under ``out``; returns the manifest (plus timing and notes).

    One job at a time per OUT: a second one raises PlanError naming the first.
    On a finished OUT, shards that have gone missing are converted again (the
    others are not touched) and the manifest is rewritten. Videos the source
    holds but the plan lacks are counted, and with ``add_new`` converted into
    new shards. ``retry_failed`` converts again the videos recorded as failed
    (finished or not). ``say`` receives one-line notes about all of this.
    """
    say = say or (lambda message: None)
    source_kw = {"videos": videos, "split": split, "classes_file": classes_file}
    check_out(out, config)  # before OUT or its lock file is created
    if not opts.dask:
        prestart()  # the shard processes' fork server imports while the source is read and planned
    source = None
    rerun = os.path.exists(os.path.join(out, PLAN))
    if not rerun:
        # Read the source before creating OUT, so a bad source leaves nothing behind.
        source = load_source(src, **source_kw)
    with hold_out(out):
        plan = prepare(src, out, config, opts, source=source, **source_kw)
        if rerun:
            source = _read_source_again(src, out, add_new, say, **source_kw)
        manifest_path = os.path.join(out, MANIFEST)
        finished = os.path.exists(manifest_path)
        notes: dict = {}
        held = HeldRecords(out=out, plan=plan)
        redo: set[int] | None = None  # None: every shard (an unfinished job)
        if finished:
            with open(manifest_path) as fh:
                manifest = json.load(fh)
            redo = _shards_to_repair(out, plan, manifest, notes, say, held)
        if rerun and source is not None:
            added = _new_videos(out, plan, source, opts, add_new, notes, say)
            if redo is not None:
                redo |= added
        retry = failed_videos(out, plan, held=held) if retry_failed else {}
        if retry_failed:
            notes["retried"] = sum(len(v) for v in retry.values())
            say(f"{out}: retrying {notes['retried']} video(s) recorded as failed, in {len(retry)} shard(s)")
            if redo is not None:
                redo |= set(retry)
        if finished:
            if not redo:
                return {**manifest, **notes, "already_complete": True, "seconds": 0.0,
                        "converted": {"videos": 0, "clips": 0}}
            kept = _kept_summaries(plan, manifest, redo)
            # From here until the new manifest, OUT is an unfinished job: a kill
            # leaves it for a plain rerun to complete, never a stale manifest.
            os.remove(manifest_path)
        else:
            kept = []
        running = range(len(plan.shards)) if redo is None else sorted(redo)
        total = sum(len(plan.shards[i]) for i in running)
        space = SpaceCheck(out=out, plan=plan, pending=pending_videos(plan, running, held), say=say)
        space.start()
        t0 = time.monotonic()
        bar = _ProgressBar(out, total, opts.progress, None if redo is None else {shard_name(i) for i in redo})
        bar.start()
        try:
            summaries = run_shards(out, plan, opts, redo, retry)
        finally:
            bar.stop.set()
            bar.join()
        space.join()  # its warning said before the job's result (a failed job does not wait for it)
        for s in summaries:
            if s.get("note"):
                notes.setdefault("set_aside", []).append(s["note"])
                say(s["note"])
        manifest = finalize(out, plan, kept + summaries)
        converted = {"videos": sum(s["new_videos"] for s in summaries), "clips": sum(s["new_clips"] for s in summaries)}
        return {**manifest, **notes, "already_complete": False, "seconds": time.monotonic() - t0,
                "converted": converted}
