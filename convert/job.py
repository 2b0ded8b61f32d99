"""The conversion job: plan, run shards in parallel, then write manifest and report.

Shards run through joblib (loky processes by default, or any joblib backend
such as Dask's for several machines). The manifest is written last, from what
the shards hold, so its presence means the job is complete.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass

from joblib import Parallel, delayed, parallel_config

from .format import FORMAT_NAME, FORMAT_VERSION, MANIFEST, PLAN, PROGRESS_DIR, REPORT, SHARD_DIR, get_backend
from .plan import ConvertConfig, Plan, PlanError, check_same, default_shards, load_plan, make_plan, write_json_atomic
from .sources import load_source
from .supervise import ShardOptions, run_shard


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
    elif not os.path.exists(os.path.join(out, PLAN)) and os.listdir(out):
        raise PlanError(f"{out}: not empty and holds no conversion; use an empty or new folder")


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def prepare(src: str, out: str, config: ConvertConfig, opts: JobOptions, *, videos: str | None = None,
            split: str | None = None, classes_file: str | None = None) -> Plan:
    """Check arguments, read the source and write (or reuse) the plan."""
    check_out(out, config)
    source_info = {"path": os.path.abspath(src), "videos": os.path.abspath(videos) if videos else None,
                   "split": split}
    existing = load_plan(out) if os.path.isdir(out) else None
    if existing is not None:
        check_same(existing, config, source_info, out)
        return existing
    source = load_source(src, videos=videos, split=split, classes_file=classes_file)
    source_info["kind"] = source.kind
    workers = opts.workers or _cpu_count()
    n_shards = opts.shards or default_shards(len(source.items), workers)
    plan = make_plan(source, config, n_shards, source_info)
    os.makedirs(os.path.join(out, SHARD_DIR), exist_ok=True)
    write_json_atomic(os.path.join(out, PLAN), plan.to_dict())
    return plan


class _ProgressBar(threading.Thread):
    """Polls the shards' progress files and drives one tqdm bar in the parent."""

    def __init__(self, out: str, total: int, enabled: bool) -> None:
        super().__init__(daemon=True)
        self.dir = os.path.join(out, PROGRESS_DIR)
        self.total, self.enabled = total, enabled
        self.stop = threading.Event()

    def _read(self) -> dict:
        agg: Counter = Counter()
        if os.path.isdir(self.dir):
            for name in os.listdir(self.dir):
                if name.endswith(".json"):
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


def run_shards(out: str, plan: Plan, opts: JobOptions) -> list[dict]:
    workers = opts.workers or _cpu_count()
    tasks = [delayed(run_shard)(out, i, len(items), opts.shard) for i, items in enumerate(plan.shards)]
    if opts.dask:
        from dask.distributed import Client, LocalCluster

        cluster = LocalCluster(n_workers=workers, threads_per_worker=1) if opts.dask == "local" else None
        with Client(cluster or opts.dask), parallel_config(backend="dask"):
            results = list(Parallel(return_as="generator_unordered")(tasks))
        if cluster is not None:
            cluster.close()
        return results
    # A supervisor only waits on its shard process's pipe, so threads are enough
    # here: the decoding runs in the shard processes, one per core.
    return list(Parallel(n_jobs=min(workers, len(tasks)), backend="threading",
                         return_as="generator_unordered")(tasks))


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
        entry.update({k: s[k] for k in ("videos", "clips", "value_bytes", "sha256", "files") if k in s})
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


def run_job(src: str, out: str, config: ConvertConfig, opts: JobOptions, **source_kw) -> dict:
    """Convert ``src`` into shards under ``out``; returns the manifest (plus timing)."""
    plan = prepare(src, out, config, opts, **source_kw)
    manifest_path = os.path.join(out, MANIFEST)
    if os.path.exists(manifest_path):
        with open(manifest_path) as fh:
            manifest = json.load(fh)
        return {**manifest, "already_complete": True, "seconds": 0.0}
    total = sum(len(s) for s in plan.shards)
    t0 = time.monotonic()
    bar = _ProgressBar(out, total, opts.progress)
    bar.start()
    try:
        summaries = run_shards(out, plan, opts)
    finally:
        bar.stop.set()
        bar.join()
    manifest = finalize(out, plan, summaries)
    return {**manifest, "already_complete": False, "seconds": time.monotonic() - t0}
