"""The end of a job: ``report.jsonl`` and, last, ``manifest.json``, from what the shards hold."""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from dataclasses import asdict

from ..format import MANIFEST, PLAN, REPORT, SUMMARY_KEYS, Manifest, ShardEntry, get_backend, shard_name
from ..format.base import CONTENT_KEY
from ..format.errors import storing
from ..format.layout import MANIFEST_VERSION, write_json_atomic
from ..format.manifest import PlanRecord, Totals, content_fingerprint
from ..worker.plan import Plan


def manifest_entry(summary: dict, out: str, plan: Plan) -> ShardEntry:
    """The manifest's entry of a shard from its summary (``finish``'s, plus ``index``), with the backend's extras and
    the shard's files (each file read once, for its checksum)."""
    path = plan.shard_path(out, summary["index"])
    backend = get_backend(plan.config.backend)
    with storing("reading", path):
        files = backend.files.describe(path)
    return ShardEntry(name=os.path.basename(path), path=os.path.relpath(path, out), index=summary["index"],
                      **{k: summary[k] for k in SUMMARY_KEYS}, shard_files=files,
                      extras={k: summary[k] for k in (*backend.manifest_extras, CONTENT_KEY) if k in summary})


def finalize(out: str, plan: Plan, summaries: list[dict]) -> Manifest:
    """Write report.jsonl and, last, manifest.json from what the shards hold; returns the manifest."""
    backend = get_backend(plan.config.backend)
    statuses: Counter = Counter()
    records = [asdict(p) for p in plan.problems]
    statuses.update(p.status for p in plan.problems)
    shards = []
    for s in sorted(summaries, key=lambda s: s["index"]):
        reader = backend.reader(plan.shard_path(out, s["index"]))
        try:
            shard_records = reader.records()
        finally:
            reader.close()
        for rec in shard_records:
            statuses[rec.status] += 1
            if rec.status != "ok":
                records.append({"id": rec.video_id, "path": rec.path, "status": rec.status, "reason": rec.reason})
        shards.append(manifest_entry(s, out, plan))
    tmp = os.path.join(out, REPORT + ".tmp")
    with storing("writing", tmp):
        with open(tmp, "w") as fh:
            for r in sorted(records, key=lambda r: r["id"]):
                fh.write(json.dumps(r, sort_keys=True) + "\n")
        os.replace(tmp, os.path.join(out, REPORT))
    data = plan.config.data_spec(plan.classes)
    contents = [c for c in (s.extras.get(CONTENT_KEY) for s in shards) if isinstance(c, str)]
    # A shard finished by an earlier release has no content sum: the conversion then has no fingerprint.
    fingerprint = content_fingerprint(data, contents) if len(contents) == len(shards) else None
    plan_path = os.path.join(out, PLAN)
    with storing("reading", plan_path):
        # What readers check the manifest against instead of parsing the plan (check_plan).
        recorded = (PlanRecord.of_file(plan_path, [shard_name(i) for i in range(len(plan.shards))])
                    if os.path.exists(plan_path) else None)
    manifest = Manifest(
        format_version=MANIFEST_VERSION, data=data, shards=tuple(shards), fingerprint=fingerprint, plan=recorded,
        totals=Totals(videos=sum(s.videos for s in shards), clips=sum(s.clips for s in shards),
                      value_bytes=sum(s.value_bytes for s in shards)),
        status_counts=dict(sorted(statuses.items())), source=dict(plan.source),
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    write_json_atomic(os.path.join(out, MANIFEST), manifest.to_dict(), indent=1)
    return manifest


__all__ = ["finalize", "manifest_entry"]
