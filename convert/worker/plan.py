"""The job's settings and its plan: which video goes to which shard.

The plan is written once, atomically, at the first run and reused by every
rerun, so a restart finds each video in the same shard whatever ``--workers``
says. Settings that change the stored bytes are part of the plan; a rerun that
disagrees with them is refused before any work.
"""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from ..format import (
    BACKENDS,
    FORMAT_NAME,
    FORMAT_VERSION,
    PLAN,
    SHARD_DIR,
    WRITE_CODECS,
    DataSpec,
    FormatError,
    get_codec,
    shard_name,
)
from ..format.layout import MAX_PLAN_BYTES, read_json_file
from ..format.manifest import ClipSettings, FrameSize
from .clips import ClipSpec
from .decode import FrameSpec
from .sources import Problem, Source, VideoItem

DAMAGE_POLICIES = ("keep", "skip")


class PlanError(ValueError):
    """OUT cannot take this job (another format, other settings)."""


def another_out(staging_of: str | None = None) -> str:
    """What a message advises instead of an OUT that cannot take this job: ``another OUT``; or, when that folder
    is the local staging folder of the URL ``staging_of``, ``another --staging folder``.

    The conflict is then in the staging folder, not at the URL: another
    URL given with the same ``--staging`` would meet the same folder.
    """
    if staging_of is None:
        return "another OUT"
    return f"another --staging folder (this one stages {staging_of})"


@dataclass(frozen=True)
class ConvertConfig:
    """Everything that decides the bytes in the shards."""

    backend: str = "lmdb"
    codec: str = "raw"
    size: tuple[int, int] | None = (128, 171)
    short_side: int | None = None
    fps: float | None = None
    clip_len: int = 16
    stride: int = 1
    step: int | None = None
    max_clips: int | None = None
    short: str = "skip"
    # ClipSpec.tail: "keep" stores the frames after the last whole clip in one more clip. Opt-in: "drop" gives the
    # clips conversions gave before the option, clip for clip.
    tail: str = "drop"
    on_damage: str = "keep"
    quality: int | None = None  # the codec's own scale (jpeg 1-100, h264/vp9 CRF); None: the codec's default

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown backend {self.backend!r}; choose one of {', '.join(BACKENDS)}")
        get_codec(self.codec, self.quality)  # an unknown codec, or a quality outside its scale: one line
        if self.on_damage not in DAMAGE_POLICIES:
            raise ValueError(f"on_damage must be one of {', '.join(DAMAGE_POLICIES)}, got {self.on_damage!r}")
        self.frame_spec()  # validates size / short side / fps
        self.clip_spec()

    def frame_spec(self, threads: int = 1) -> FrameSpec:
        return FrameSpec(size=(self.size[0], self.size[1]) if self.size else None, short_side=self.short_side,
                         fps=self.fps, threads=threads)

    def clip_spec(self) -> ClipSpec:
        return ClipSpec(clip_len=self.clip_len, stride=self.stride, step=self.step,
                        max_clips=self.max_clips, short=self.short, tail=self.tail)

    def data_spec(self, classes: list[str]) -> DataSpec:
        """What defines the stored data: the manifest's fields that every shard stores too (FORMAT.md)."""
        return DataSpec(
            backend=self.backend, codec=self.codec, codec_id=get_codec(self.codec).id, classes=tuple(classes),
            clip_shape=(self.clip_len, self.size[0], self.size[1], 3) if self.size else None,
            frame_size=FrameSize(size=tuple(self.size) if self.size else None, short_side=self.short_side),  # type: ignore[arg-type]
            fps=self.fps,
            clip=ClipSettings(clip_len=self.clip_len, stride=self.stride, step=self.clip_spec().start_step,
                              max_clips=self.max_clips, short=self.short, tail=self.clip_spec().keeps_tail),
            on_damage=self.on_damage, quality=WRITE_CODECS[self.codec].recorded_quality(self.quality))

    def to_dict(self) -> dict:
        d = asdict(self)
        d["size"] = list(self.size) if self.size else None
        return d

    @classmethod
    def from_dict(cls, d: dict) -> ConvertConfig:
        d = dict(d)
        d["size"] = tuple(d["size"]) if d.get("size") else None
        return cls(**d)


def shard_path(out: str, index: int) -> str:
    """The folder of shard ``index`` under ``out``."""
    return os.path.join(out, SHARD_DIR, shard_name(index))


@dataclass
class Plan:
    config: ConvertConfig
    classes: list[str]
    shards: list[list[VideoItem]]
    problems: list[Problem] = field(default_factory=list)
    source: dict = field(default_factory=dict)
    added: list[dict] = field(default_factory=list)  # one entry per --add-new that appended shards

    def shard_path(self, out: str, index: int) -> str:
        return shard_path(out, index)

    def shard(self, index: int) -> ShardPlan:
        """Shard ``index``'s part of the plan: all that its shard process is given."""
        return ShardPlan(config=self.config, classes=tuple(self.classes), index=index, count=len(self.shards),
                         items=tuple(self.shards[index]))

    def to_dict(self) -> dict:
        return {
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION,
            "source": self.source,
            "config": self.config.to_dict(),
            "classes": self.classes,
            "shards": [{"name": shard_name(i), "items": [[it.id, it.path, it.label] for it in items]}
                       for i, items in enumerate(self.shards)],
            "problems": [asdict(p) for p in self.problems],
            "added": self.added,
        }

    @classmethod
    def from_dict(cls, d: dict) -> Plan:
        return cls(
            config=ConvertConfig.from_dict(d["config"]),
            classes=d["classes"],
            shards=[[VideoItem(*it) for it in s["items"]] for s in d["shards"]],
            problems=[Problem(**p) for p in d["problems"]],
            source=d["source"],
            added=d.get("added", []),
        )


@dataclass(frozen=True, kw_only=True)
class ShardPlan:
    """One shard's part of the plan: its videos, and what its writer stores beside them.

    A shard process is given this and nothing more (the job sends it down the
    process's command pipe, ``convert.job.supervise``), so that starting one
    costs the same time and memory whatever the dataset's size: each shard
    process parsing the whole plan.json would cost every start the whole
    dataset's share, and no ``--max-memory`` would be low enough to stay
    legal at Kinetics' size. plan.json stays the job's record.
    ``count``: the plan's number of shards, which every shard stores.
    """

    config: ConvertConfig
    classes: tuple[str, ...]
    index: int
    count: int
    items: tuple[VideoItem, ...]

    def __post_init__(self) -> None:
        if not (type(self.index) is int and type(self.count) is int and 0 <= self.index < self.count):
            raise ValueError(f"shard index {self.index!r} is not one of the plan's {self.count!r} shards")
        if not all(isinstance(it, VideoItem) for it in self.items):
            raise TypeError("a shard's items must be VideoItems")

    @property
    def name(self) -> str:
        return shard_name(self.index)

    def path(self, out: str) -> str:
        """The shard's folder under ``out``."""
        return shard_path(out, self.index)

    def data_spec(self) -> DataSpec:
        """What the shard stores as its data's definition (the manifest's fields, ``ConvertConfig.data_spec``)."""
        return self.config.data_spec(list(self.classes))

    def to_dict(self) -> dict:
        return {"config": self.config.to_dict(), "classes": list(self.classes), "index": self.index,
                "count": self.count, "items": [[it.id, it.path, it.label] for it in self.items]}

    @classmethod
    def from_dict(cls, d: Any) -> ShardPlan:
        """The shard plan ``to_dict`` gave; PlanError in one line when ``d`` is not one."""
        try:
            return cls(config=ConvertConfig.from_dict(d["config"]), classes=tuple(d["classes"]),
                       index=d["index"], count=d["count"], items=tuple(VideoItem(*it) for it in d["items"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise PlanError(f"not a shard's plan: {type(exc).__name__}: {exc}") from None


def default_shards(n_videos: int, workers: int, videos_per_shard: int = 1000) -> int:
    """Enough shards to keep every worker busy, and none over ``videos_per_shard``."""
    return max(1, min(n_videos, max(math.ceil(n_videos / videos_per_shard), 2 * workers)))


def _stable_hash(video_id: str) -> bytes:
    return hashlib.blake2b(video_id.encode("utf-8"), digest_size=8).digest()


def make_plan(source: Source, config: ConvertConfig, n_shards: int, source_info: dict) -> Plan:
    """Deal the videos round-robin in order of a stable hash of their id.

    Shards get equal counts and a mix of classes, and no pattern in the names
    (say, every fourth file a long one) lines up with the shard count. Each
    shard converts its videos in that hash order too: a TFRecord part file
    then holds videos of mixed classes in no pattern, which DALI's file-level
    and buffer shuffle needs (class-folder ids in id order would put a
    class's videos side by side). Readers do not depend on it: a shard's
    reading order is its records sorted by id (FORMAT.md).
    """
    shards: list[list[VideoItem]] = [[] for _ in range(n_shards)]
    for i, item in enumerate(sorted(source.items, key=lambda it: _stable_hash(it.id))):
        shards[i % n_shards].append(item)
    return Plan(config, source.classes, shards, list(source.problems), source_info)


def admit(source: Source, backend: str) -> Source:
    """``source`` with the videos ``backend`` cannot store (an id it cannot key) moved to its problems."""
    writer = BACKENDS[backend].writer
    kept, problems = [], list(source.problems)
    for item in source.items:
        why = writer.id_problem(item.id)
        if why is None:
            kept.append(item)
        else:
            problems.append(Problem(item.id, item.path, "rejected", why))
    return Source(kept, source.classes, problems, source.kind)


def add_shards(plan: Plan, source: Source, n_shards: int, *, staging_of: str | None = None) -> list[VideoItem]:
    """Append the source's videos that the plan lacks as ``n_shards`` new shards; returns them.

    The existing shards keep their videos, so their bytes stay as they are.
    Problems the plan recorded for videos that are now there are dropped, and
    the source's other new problems are added. ``staging_of``: the URL whose
    staging folder the plan is in (``another_out``).
    """
    if source.classes != plan.classes:
        gone = [c for c in plan.classes if c not in source.classes]
        new = [c for c in source.classes if c not in plan.classes]
        what = "; ".join(filter(None, [f"new: {', '.join(new)}" if new else "",
                                       f"gone: {', '.join(gone)}" if gone else ""])) or "same names, other order"
        raise PlanError(f"the source's class list differs from the plan's ({what}); adding videos cannot relabel "
                        f"converted shards: give --classes with the plan's list, or convert into "
                        f"{another_out(staging_of)}")
    planned = {it.id for shard in plan.shards for it in shard}
    items = [it for it in source.items if it.id not in planned]
    if not items:
        return []
    first = len(plan.shards)
    plan.shards += make_plan(Source(items, source.classes), plan.config, n_shards, plan.source).shards
    added = {it.id for it in items}
    known = {p.id for p in plan.problems}
    plan.problems = ([p for p in plan.problems if p.id not in added]
                     + [p for p in source.problems if p.id not in known and p.id not in planned])
    plan.added.append({"first_shard": first, "shards": len(plan.shards) - first, "videos": len(items)})
    return items


def load_plan(out: str, *, staging_of: str | None = None) -> Plan | None:
    """OUT's plan; None when it has none. PlanError in one line naming plan.json and the fix when it cannot be
    read: read as the manifest is (no FIFO, at most ``MAX_PLAN_BYTES``, a truncated or deeply nested file refused
    in a line, never a traceback), then checked to be a plan of this format.

    The fix is never to delete the plan alone: it is the only record of which
    video went to which shard (a plan made again from a source that has
    changed, or with another shard count, would deal the videos the shards
    hold otherwise). ``staging_of``: the URL whose staging folder ``out`` is,
    for the advice (``another_out``).
    """
    path = os.path.join(out, PLAN)
    if not os.path.lexists(path):
        return None
    fix = (f"it is the job's only record of which video goes to which shard: put back a copy of it, or convert "
           f"into {another_out(staging_of)} (or remove {out} and run again)")
    try:
        d = read_json_file(path, "plan", limit=MAX_PLAN_BYTES)
    except FormatError as exc:
        raise PlanError(f"{exc}; {fix}") from None
    if not isinstance(d, dict) or d.get("format") != FORMAT_NAME:
        got = d.get("format") if isinstance(d, dict) else type(d).__name__
        raise PlanError(f"{path}: not a {FORMAT_NAME} plan (format {got!r}); {fix}")
    try:
        return Plan.from_dict(d)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise PlanError(f"{path}: not a readable plan ({type(exc).__name__}: {exc}); {fix}") from None


def check_same(existing: Plan, config: ConvertConfig, source_info: dict, out: str, *,
               staging_of: str | None = None) -> None:
    """Refuse a rerun whose settings would give different bytes than the first run; ``staging_of``: the URL whose
    staging folder ``out`` is, for the advice (``another_out``)."""
    another = another_out(staging_of)
    old, new = existing.config.to_dict(), config.to_dict()
    diffs = [f"{k} {old[k]!r} -> {new[k]!r}" for k in old if old[k] != new.get(k)]
    if existing.config.backend != config.backend:
        raise PlanError(f"{out}: holds {existing.config.backend} shards, asked for {config.backend}; use {another}")
    if diffs:
        raise PlanError(f"{out}: was converted with other settings ({'; '.join(diffs)}); use {another} or the "
                        f"same options")
    # The plan's videos are absolute paths, so a rerun from another working directory, or naming the source
    # by another path to the same place, finds them; one whose source is another place is refused.
    for key, what in (("path", "SRC"), ("videos", "--videos")):
        was, now = existing.source.get(key), source_info.get(key)
        if not _same_place(was, now):
            raise PlanError(f"{out}: was converted from {what} {was}, not {now}; run it with the same source, or "
                            f"use {another}")
    # A split means something for a CSV only: a plan of another kind of source that records one (written before
    # --split was refused for it, which selected nothing) is the same source without it.
    split_matters = existing.source.get("kind") in (None, "csv")
    if split_matters and existing.source.get("split") != source_info.get("split"):
        raise PlanError(f"{out}: was converted with --split {existing.source.get('split')}, not "
                        f"{source_info.get('split')}; use {another} or the same split")


def _same_place(a: str | None, b: str | None) -> bool:
    """Whether two source paths (absolute, as plans store them) name the same file or folder."""
    if a is None or b is None:
        return a == b
    return a == b or os.path.realpath(a) == os.path.realpath(b)
