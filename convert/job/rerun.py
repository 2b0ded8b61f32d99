"""What a rerun finds in an OUT that a job has written before: what each shard holds, and what to run again."""

from __future__ import annotations

import os
from collections.abc import Callable

from ..format import PLAN, SUMMARY_KEYS, FormatError, Manifest, ShardMissing, get_backend, shard_name
from ..format.layout import write_json_atomic
from ..format.system import cpu_count
from ..options import JobOptions
from ..worker.plan import Plan, PlanError, add_shards, default_shards
from ..worker.sources import Source, SourceError, load_source


def shard_records(out: str, plan: Plan, index: int) -> list | None:
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
                self._got[index] = shard_records(self.out, self.plan, index)
            except PlanError as exc:
                self._got[index] = exc
        got = self._got[index]
        if isinstance(got, PlanError):
            raise got
        return got


def missing_shards(plan: Plan, held: HeldRecords) -> list[int]:
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


def kept_summaries(plan: Plan, manifest: Manifest, redo: set[int]) -> list[dict]:
    """The manifest's entries for the shards that are not run again, as run_shard returns their summaries."""
    by_name = {s.name: s for s in manifest.shards}
    kept = []
    for i in range(len(plan.shards)):
        if i not in redo:
            entry = by_name[shard_name(i)]
            kept.append({"index": i, **{k: getattr(entry, k) for k in SUMMARY_KEYS}, **entry.extras})
    return kept


def shards_to_repair(out: str, plan: Plan, manifest: Manifest, notes: dict, say: Callable[[str], None],
                      held: HeldRecords) -> set[int]:
    """Shards of a finished OUT to run again: gone from disk, or absent from the manifest."""
    listed = {s.name for s in manifest.shards}
    missing = missing_shards(plan, held)
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


def new_videos(out: str, plan: Plan, source: Source, opts: JobOptions, add_new: bool, notes: dict,
               say: Callable[[str], None], *, staging_of: str | None = None) -> set[int]:
    """Count the source's videos the plan lacks; with ``add_new``, append them as new shards (their indices).
    ``staging_of``: the URL whose staging folder ``out`` is, for the advice of an error."""
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
        add_shards(plan, source, opts.shards or default_shards(new, opts.workers or cpu_count()),
                   staging_of=staging_of)
    except PlanError as exc:
        raise PlanError(f"{out}: {exc}") from None
    write_json_atomic(os.path.join(out, PLAN), plan.to_dict(), indent=1)
    notes["added_videos"] = new
    say(f"{out}: adding {new} new video(s) as {len(plan.shards) - first} new shard(s), "
        f"{shard_name(first)} to {shard_name(len(plan.shards) - 1)}; the other shards are kept")
    return set(range(first, len(plan.shards)))


def read_source_again(src: str, out: str, required: bool, say: Callable[[str], None], **source_kw: str | None
                       ) -> Source | None:
    """The source as it is now (a rerun looks for videos added since the plan); None if unreadable and not required."""
    try:
        return load_source(src, **source_kw)
    except (SourceError, OSError) as exc:
        if required:
            raise
        say(f"{out}: cannot read the source to look for new videos ({exc}); going on with the plan")
        return None


__all__ = ["HeldRecords", "failed_videos", "kept_summaries", "missing_shards", "new_videos", "read_source_again",
           "shard_records", "shards_to_repair"]
