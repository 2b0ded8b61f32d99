"""``manifest.json`` as typed values, read and checked once: ``read_manifest(root) -> Manifest``.

Every field FORMAT.md names is checked for its type (and the few relations a
reader relies on) as the file is read, so a damaged or hand-edited manifest
is one ``FormatError`` naming the file and the field, never a ``KeyError``
deep inside a reader. The writer builds the same objects and writes
``to_dict()``, so both sides share one definition of the layout.

``DataSpec`` is what defines the stored data: the manifest fields every shard
also stores (its metadata), compared field by field by ``check_shard_meta``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal, cast, overload

from .errors import FormatError
from .layout import (
    FORMAT_NAME,
    FORMAT_VERSION,
    MANIFEST,
    MAX_ASPECT,
    MAX_PLAN_BYTES,
    PLAN,
    READABLE_MANIFEST_VERSIONS,
    SHARD_DIR,
    file_sha256,
    plain_name,
    read_json_file,
    relative_path,
    version_problem,
)


def _get(d: Mapping[str, Any], key: str, kinds: type | tuple[type, ...], where: str, *,
         optional: bool = False) -> Any:
    """``d[key]`` checked to be one of ``kinds`` (None allowed when ``optional``); FormatError naming it."""
    if key not in d:
        raise FormatError(f"{where}: lacks {key!r}")
    value = d[key]
    if value is None and optional:
        return None
    numbers = kinds in (int, float) or (isinstance(kinds, tuple) and int in kinds)
    ok = isinstance(value, kinds) and not (numbers and isinstance(value, bool))
    if ok and isinstance(value, float) and not math.isfinite(value):
        ok = False
    if not ok:
        names = kinds.__name__ if isinstance(kinds, type) else " or ".join(k.__name__ for k in kinds)
        raise FormatError(f"{where}: {key} is {_short(value)}, expected {names}{' or null' if optional else ''}")
    return value


@overload
def _count(d: Mapping[str, Any], key: str, where: str, *, low: int = ..., optional: Literal[False] = ...) -> int: ...
@overload
def _count(d: Mapping[str, Any], key: str, where: str, *, low: int = ..., optional: bool) -> int | None: ...
def _count(d: Mapping[str, Any], key: str, where: str, *, low: int = 0, optional: bool = False) -> int | None:
    """``d[key]``, an integer >= ``low`` (None when ``optional`` and absent); FormatError naming ``where``."""
    value: int | None = _get(d, key, int, where, optional=optional)
    if value is not None and value < low:
        raise FormatError(f"{where}: {key} is {value}, expected an integer >= {low}")
    return value


def _short(value: Any) -> str:
    """``value`` as JSON, cut to 60 characters (for one-line messages)."""
    text = json.dumps(value, default=repr)
    return text if len(text) <= 60 else text[:57] + "..."


def _ints(value: Any, n: int, key: str, where: str) -> tuple[int, ...]:
    if not isinstance(value, list) or len(value) != n or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value):
        raise FormatError(f"{where}: {key} is {_short(value)}, expected {n} integers >= 1")
    return tuple(value)


@dataclass(frozen=True)
class ClipSettings:
    """How a video's frames were cut into clips (FORMAT.md, *Clips of a video*)."""

    clip_len: int
    stride: int
    step: int
    max_clips: int | None
    short: str
    # The frames after a video's last whole clip are stored in one more clip, its last clip_len frames
    # (FORMAT.md, *Clips of a video*); False in conversions written before it was kept, and then left out.
    tail: bool = False

    @classmethod
    def from_dict(cls, d: Any, where: str) -> ClipSettings:
        if not isinstance(d, dict):
            raise FormatError(f"{where}: clip is {_short(d)}, expected an object")
        w = f"{where}: clip"
        tail = _get(d, "tail", bool, w) if "tail" in d else False
        settings = cls(clip_len=_count(d, "clip_len", w, low=1), stride=_count(d, "stride", w, low=1),
                       step=_count(d, "step", w, low=1), max_clips=_count(d, "max_clips", w, low=1, optional=True),
                       short=_get(d, "short", str, w), tail=tail)
        if tail and (settings.stride, settings.step) != (1, settings.clip_len):
            raise FormatError(f"{w}: tail is true, but its clips (stride {settings.stride}, step {settings.step}) "
                              f"do not tile a video")
        return settings

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"clip_len": self.clip_len, "stride": self.stride, "step": self.step,
                             "max_clips": self.max_clips, "short": self.short}
        if self.tail:  # a conversion without tail clips is stored as before, byte for byte
            d["tail"] = True
        return d


@dataclass(frozen=True)
class FrameSize:
    """Every frame resized to ``size`` (H, W), or its short side to ``short_side``: exactly one is set."""

    size: tuple[int, int] | None
    short_side: int | None

    @classmethod
    def from_dict(cls, d: Any, where: str) -> FrameSize:
        if not isinstance(d, dict):
            raise FormatError(f"{where}: frame_size is {_short(d)}, expected an object")
        raw = _get(d, "size", list, f"{where}: frame_size", optional=True)
        size = None if raw is None else _ints(raw, 2, "frame_size.size", where)
        short = _count(d, "short_side", f"{where}: frame_size", low=1, optional=True)
        if (size is None) == (short is None):
            raise FormatError(f"{where}: frame_size must set exactly one of size and short_side, got {_short(d)}")
        return cls(size=size, short_side=short)  # type: ignore[arg-type]

    def to_dict(self) -> dict[str, Any]:
        return {"size": list(self.size) if self.size else None, "short_side": self.short_side}


@dataclass(frozen=True)
class DataSpec:
    """What defines the stored data: the manifest fields every shard stores a copy of (its metadata)."""

    backend: str
    codec: str
    codec_id: int
    classes: tuple[str, ...]
    clip_shape: tuple[int, int, int, int] | None
    frame_size: FrameSize
    fps: float | None
    clip: ClipSettings
    on_damage: str
    quality: int | None = None  # the codec's quality setting, where recorded (FORMAT.md: absent = its default)

    def to_dict(self) -> dict[str, Any]:
        """The JSON values, in FORMAT.md's order (``quality`` only where recorded, so older conversions' metadata
        and fingerprints stay as they were)."""
        d = {"backend": self.backend, "codec": self.codec, "codec_id": self.codec_id,
             "classes": list(self.classes), "clip_shape": list(self.clip_shape) if self.clip_shape else None,
             "frame_size": self.frame_size.to_dict(), "fps": self.fps, "clip": self.clip.to_dict(),
             "on_damage": self.on_damage}
        if self.quality is not None:
            d["quality"] = self.quality
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str) -> DataSpec:
        """Checked fields of a manifest (or of a shard's metadata)."""
        codec = _get(d, "codec", str, where)
        codec_id = _get(d, "codec_id", int, where)
        classes = _get(d, "classes", list, where)
        if not all(isinstance(c, str) for c in classes):
            raise FormatError(f"{where}: classes must be a list of names (strings)")
        if len(set(classes)) != len(classes):
            raise FormatError(f"{where}: class names repeat")
        raw_shape = _get(d, "clip_shape", list, where, optional=True)
        spec = cls(backend=_get(d, "backend", str, where),
                   codec=codec, codec_id=codec_id, classes=tuple(classes),
                   clip_shape=None if raw_shape is None else _ints(raw_shape, 4, "clip_shape", where),  # type: ignore[arg-type]
                   frame_size=FrameSize.from_dict(d.get("frame_size"), where),
                   fps=_get(d, "fps", (int, float), where, optional=True),
                   clip=ClipSettings.from_dict(d.get("clip"), where), on_damage=_get(d, "on_damage", str, where),
                   quality=_get(d, "quality", int, where, optional=True) if "quality" in d else None)
        # The clip shape is what the frame size and clip length make: the bound every header is held to
        # (``shape_problem``) comes from fields that agree.
        size = spec.frame_size.size
        made = None if size is None else (spec.clip.clip_len, *size, 3)
        if spec.clip_shape != made:
            raise FormatError(f"{where}: clip_shape {_short(raw_shape)} is not what clip_len "
                              f"{spec.clip.clip_len} and frame_size {_short(spec.frame_size.to_dict())} make")
        return spec

    def shape_problem(self, shape: tuple[int, ...]) -> str | None:
        """Why a clip header's ``shape`` (T, H, W, C) is none this conversion can hold, in one line; None when it is.

        A fixed-size conversion holds its ``clip_shape`` only. With a short
        side S: T is the clip length, C is 3, the shorter of H and W is S and
        the longer at most ``MAX_ASPECT`` * S (FORMAT.md, *Clip values*).
        Every reader asks this of a header before it decodes the payload, so a
        forged header cannot make it allocate more than ``max_clip_bytes``.
        """
        shape = tuple(shape)
        if self.clip_shape is not None:
            return None if shape == self.clip_shape else f"shape {shape}, the manifest says {self.clip_shape}"
        t, h, w, c = shape
        if t != self.clip.clip_len or c != 3:
            return f"shape {shape}, the conversion's clips are {self.clip.clip_len} frames of 3 channels"
        size, short = self.frame_size.size, self.frame_size.short_side
        if size is not None:
            return None if (h, w) == size else f"shape {shape}, the conversion's frames are {size[0]}x{size[1]}"
        if min(h, w) != short or max(h, w) > MAX_ASPECT * short:
            return (f"shape {shape}, the conversion's frames have a short side of {short} and a long side of at "
                    f"most {MAX_ASPECT * cast(int, short)}")
        return None

    def timeline_problem(self) -> str | None:
        """Why this conversion's clips are not a frame timeline of each video, in one line; None when they are.

        Clips of stride 1 whose step is the clip length tile a video: frame i
        of the video is frame ``i % T`` of its clip ``i // T`` (FORMAT.md,
        *Frame timeline*), so a reader can assemble any frames of it. Clips
        with gaps or overlaps can still be read as clips, not as a timeline.
        """
        c = self.clip
        if c.stride == 1 and c.step == c.clip_len:
            return None
        return (f"its clips (clip_len {c.clip_len}, stride {c.stride}, step {c.step}) do not tile each video's "
                f"frames (stride 1 and step = clip_len do), so they are read as clips only; convert with the "
                f"default --stride 1 and --step to read frames at any step and length")

    def shape_bounds(self) -> tuple[tuple[int, int, int, int], tuple[int, int, int, int]]:
        """(lowest, highest) of each of (T, H, W, C) ``shape_problem`` allows: the box a reader that cannot ask
        it per clip before decoding (DALI's native route) clamps a record's shape into."""
        if self.clip_shape is not None:
            return self.clip_shape, self.clip_shape
        short, t = cast(int, self.frame_size.short_side), self.clip.clip_len
        if self.frame_size.size is not None:
            return (t, *self.frame_size.size, 3), (t, *self.frame_size.size, 3)
        return (t, short, short, 3), (t, MAX_ASPECT * short, MAX_ASPECT * short, 3)

    @property
    def max_clip_bytes(self) -> int:
        """The most bytes one decoded clip of this conversion can take (T * H * W * 3 of its largest shape)."""
        if self.clip_shape is not None:
            t, h, w, c = self.clip_shape
            return t * h * w * c
        size, short = self.frame_size.size, self.frame_size.short_side
        area = size[0] * size[1] if size is not None else cast(int, short) ** 2 * MAX_ASPECT
        return self.clip.clip_len * area * 3


DATA_KEYS = tuple(f.name for f in fields(DataSpec))


def _check_files(value: Any, where: str) -> None:
    """A shard's ``files`` list (TFRecord: its record and index files): objects whose names are plain file names."""
    if not isinstance(value, list):
        raise FormatError(f"{where} is {_short(value)}, expected a list")
    for k, f in enumerate(value):
        w = f"{where}[{k}]"
        if not isinstance(f, dict):
            raise FormatError(f"{w} is {_short(f)}, expected an object")
        plain_name(_get(f, "path", str, w), "path", w)
        if "index" in f:
            plain_name(_get(f, "index", str, w), "index", w)
        _count(f, "bytes", w)


@dataclass(frozen=True)
class ShardFile:
    """One file of a shard as the manifest lists it (format version 3): its plain name, size and SHA-256."""

    name: str
    bytes: int
    sha256: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "bytes": self.bytes, "sha256": self.sha256}

    @classmethod
    def from_dict(cls, d: Any, where: str) -> ShardFile:
        if not isinstance(d, dict):
            raise FormatError(f"{where} is {_short(d)}, expected an object")
        sha = _get(d, "sha256", str, where)
        if not _HEX64.fullmatch(sha):
            raise FormatError(f"{where}: sha256 {_short(sha)} is not 64 lowercase hex digits")
        return cls(name=plain_name(_get(d, "name", str, where), "name", where),
                   bytes=_count(d, "bytes", where), sha256=sha)


def _shard_files(value: Any, where: str) -> tuple[ShardFile, ...]:
    """A shard's ``shard_files``: distinct plain file names, each with its size and checksum."""
    if not isinstance(value, list) or not value:
        raise FormatError(f"{where} is {_short(value)}, expected a non-empty list")
    out = tuple(ShardFile.from_dict(f, f"{where}[{k}]") for k, f in enumerate(value))
    seen: set[str] = set()
    for f in out:
        if f.name in seen:
            raise FormatError(f"{where}: file {f.name!r} is listed twice")
        seen.add(f.name)
    return out


def _with_files(shards: tuple[ShardEntry, ...], listed: dict[str, Any], where: str) -> tuple[ShardEntry, ...]:
    """``shards`` each given its files from the manifest's ``shard_files`` (by shard name: one list per shard). A key
    naming no listed shard is ignored: a shard dropped from the list is caught by the shards' own metadata
    (``check_shard_meta``), which says more."""
    lacking = [s.name for s in shards if s.name not in listed]
    if lacking:
        raise FormatError(f"{where}: shard_files lacks shard {_short(lacking[0])}")
    return tuple(replace(s, shard_files=_shard_files(listed[s.name], f"{where}: shard_files[{_short(s.name)}]"))
                 for s in shards)


@dataclass(frozen=True)
class ShardEntry:
    """One shard as the manifest lists it; ``extras`` the fields its backend adds (TFRecord: ``files``);
    ``shard_files`` its files, from the manifest's ``shard_files`` (None in a version 2 manifest)."""

    name: str
    path: str
    index: int
    videos: int
    clips: int
    value_bytes: int
    sha256: str
    extras: dict[str, Any] = field(default_factory=dict)
    shard_files: tuple[ShardFile, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "path": self.path, "index": self.index, "videos": self.videos,
                "clips": self.clips, "value_bytes": self.value_bytes, "sha256": self.sha256, **self.extras}

    @classmethod
    def from_dict(cls, d: Any, where: str, position: int) -> ShardEntry:
        w = f"{where}: shards[{position}]"
        if not isinstance(d, dict):
            raise FormatError(f"{w} is {_short(d)}, expected an object")
        # The name and the path become local paths (a cache's lock and index files, a mirror's folders):
        # plain names only, under shards/, or the manifest is refused (a bucket's manifest is a stranger's).
        name = plain_name(_get(d, "name", str, w), "name", w)
        path = _get(d, "path", str, w)
        if path.split("/")[0] != SHARD_DIR or path.count("/") < 1:
            raise FormatError(f"{w}: path {_short(path)} leaves the conversion folder's {SHARD_DIR}/")
        relative_path(path, "path", w)
        if "files" in d:
            _check_files(d["files"], f"{w}: files")
        for key, bits in ((CONTENT_KEY, CONTENT_BITS), (LEGACY_CONTENT_KEY, LEGACY_CONTENT_BITS)):
            content = d.get(key)
            if content is not None and not (isinstance(content, str) and len(content) == bits // 4
                                            and _HEX.fullmatch(content)):
                raise FormatError(f"{w}: {key} {_short(content)} is not {bits // 4} lowercase hex digits")
        # A reordered list is caught against the shards' own metadata, which says where each shard belongs
        # (check_shard_meta), so the index is read, not judged, here.
        index = _get(d, "index", int, w)
        known = {f.name for f in fields(cls)} - {"extras", "shard_files"}
        return cls(name=name, path=path, index=index, videos=_count(d, "videos", w),
                   clips=_count(d, "clips", w), value_bytes=_count(d, "value_bytes", w),
                   sha256=_get(d, "sha256", str, w), extras={k: v for k, v in d.items() if k not in known})


def _check_distinct(shards: tuple[ShardEntry, ...], where: str) -> None:
    """Two shards never share a name or a folder, nor lies one's folder inside another's (they would share
    files, and a cache the lock and index files named after them)."""
    names: set[str] = set()
    for k, s in enumerate(shards):
        if s.name in names:
            raise FormatError(f"{where}: shards[{k}]: name {_short(s.name)} is another shard's too")
        names.add(s.name)
    paths = sorted(s.path + "/" for s in shards)
    for a, b in zip(paths, paths[1:]):
        if b.startswith(a):
            raise FormatError(f"{where}: shard path {_short(b[:-1])} lies inside (or is) shard path {_short(a[:-1])}")


@dataclass(frozen=True, kw_only=True)
class PlanRecord:
    """What the manifest records of the plan.json it was written from (FORMAT.md, *manifest.json*, ``plan``): its
    size and SHA-256, and the names of the shards it made, in order. A reader checks the manifest against the plan
    with these (``check_plan``) without parsing plan.json, which lists every video."""

    bytes: int
    sha256: str
    shards: tuple[str, ...]

    def __post_init__(self) -> None:
        if self.bytes < 0 or not _HEX64.fullmatch(self.sha256):
            raise ValueError(f"plan record: {self.bytes} bytes, sha256 {self.sha256!r}")

    def to_dict(self) -> dict[str, Any]:
        return {"bytes": self.bytes, "sha256": self.sha256, "shards": list(self.shards)}

    @classmethod
    def from_dict(cls, d: Any, where: str) -> PlanRecord:
        w = f"{where}: plan"
        if not isinstance(d, dict):
            raise FormatError(f"{w} is {_short(d)}, expected an object")
        sha = _get(d, "sha256", str, w)
        if not _HEX64.fullmatch(sha):
            raise FormatError(f"{w}: sha256 {_short(sha)} is not 64 lowercase hex digits")
        names = _get(d, "shards", list, w)
        if not all(isinstance(n, str) for n in names):
            raise FormatError(f"{w}: shards must be a list of shard names (strings)")
        return cls(bytes=_count(d, "bytes", w), sha256=sha, shards=tuple(names))

    @classmethod
    def of_file(cls, path: str, shards: Sequence[str]) -> PlanRecord:
        """The record of the plan at ``path`` that made ``shards`` (OSError as it comes)."""
        return cls(bytes=os.path.getsize(path), sha256=file_sha256(path), shards=tuple(shards))


@dataclass(frozen=True)
class Totals:
    """Counts summed over the shards."""

    videos: int
    clips: int
    value_bytes: int

    def to_dict(self) -> dict[str, int]:
        return {"videos": self.videos, "clips": self.clips, "value_bytes": self.value_bytes}


@dataclass(frozen=True)
class Manifest:
    """A finished conversion's ``manifest.json`` (FORMAT.md, *manifest.json*)."""

    format_version: int
    data: DataSpec
    shards: tuple[ShardEntry, ...]
    totals: Totals
    status_counts: dict[str, int]
    source: dict[str, Any]
    created: str
    fingerprint: str | None = None  # content_fingerprint; None for a conversion written before it was recorded
    plan: PlanRecord | None = None  # None for a conversion written before it was recorded, or without a plan

    @property
    def classes(self) -> tuple[str, ...]:
        return self.data.classes

    @property
    def num_classes(self) -> int:
        return len(self.data.classes)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object as the writer writes it."""
        return {"format": FORMAT_NAME, "format_version": self.format_version, **self.data.to_dict(),
                "num_classes": self.num_classes, "shards": [s.to_dict() for s in self.shards],
                "totals": self.totals.to_dict(), "status_counts": dict(self.status_counts),
                "source": dict(self.source), "created": self.created, **self._files_dict(),
                **({"fingerprint": self.fingerprint} if self.fingerprint is not None else {}),
                **({"plan": self.plan.to_dict()} if self.plan is not None else {})}

    @classmethod
    def from_dict(cls, d: Any, where: str) -> Manifest:
        """Check a parsed manifest; FormatError (naming ``where`` and the field) when it is not one."""
        if not isinstance(d, dict):
            raise FormatError(f"{where}: is {type(d).__name__}, not a JSON object")
        if d.get("format") != FORMAT_NAME:
            raise FormatError(f"{where}: format {d.get('format')!r} is not {FORMAT_NAME!r}")
        version = d.get("format_version")
        if version not in READABLE_MANIFEST_VERSIONS or isinstance(version, bool):
            raise FormatError(f"{where}: {version_problem(version, 'format version', READABLE_MANIFEST_VERSIONS)}")
        data = DataSpec.from_dict(d, where)
        if _get(d, "num_classes", int, where) != len(data.classes):
            raise FormatError(f"{where}: num_classes {d['num_classes']} but {len(data.classes)} class names")
        shards = tuple(ShardEntry.from_dict(s, where, k) for k, s in enumerate(_get(d, "shards", list, where)))
        if version >= 3:
            shards = _with_files(shards, _get(d, "shard_files", dict, where), where)
        _check_distinct(shards, where)
        raw_totals = _get(d, "totals", dict, where)
        totals = Totals(videos=_count(raw_totals, "videos", f"{where}: totals"),
                        clips=_count(raw_totals, "clips", f"{where}: totals"),
                        value_bytes=_count(raw_totals, "value_bytes", f"{where}: totals"))
        counts = _get(d, "status_counts", dict, where)
        for k in counts:
            _count(counts, k, f"{where}: status_counts")
        fingerprint = d.get("fingerprint")
        if fingerprint is not None and not (isinstance(fingerprint, str) and _HEX64.fullmatch(fingerprint)):
            raise FormatError(f"{where}: fingerprint {_short(fingerprint)} is not 64 lowercase hex digits")
        plan = PlanRecord.from_dict(d["plan"], where) if d.get("plan") is not None else None
        return cls(format_version=version, data=data, shards=shards, totals=totals, status_counts=dict(counts),
                   source=dict(_get(d, "source", dict, where)), created=_get(d, "created", str, where),
                   fingerprint=fingerprint, plan=plan)

    def _files_dict(self) -> dict[str, Any]:
        """``shard_files`` as written (version 3): each shard's files by its name, in the shards' order."""
        if any(s.shard_files is None for s in self.shards) or self.format_version < 3:
            return {}
        return {"shard_files": {s.name: [f.to_dict() for f in s.shard_files or ()] for s in self.shards}}

    def shard_path(self, root: str, index: int) -> str:
        """Where shard ``index`` lies for the conversion at ``root``."""
        return os.path.join(root, self.shards[index].path)


_HEX64 = re.compile(r"[0-9a-f]{64}")
_HEX = re.compile(r"[0-9a-f]+")
# The data settings the content fingerprint covers: what decides a clip's pixels and labels, not where or how
# the clips are stored (the backend) or what was done with damaged videos (their clips are counted anyway).
FINGERPRINT_FIELDS = ("codec", "codec_id", "classes", "clip_shape", "frame_size", "fps", "clip", "quality")
# A shard's content sum (``convert.format.base.ContentSum``) in its summary and manifest entry, and its width:
# wide, because a sum of hashes is only as hard to steer as the modulus makes it (FORMAT.md, *Content fingerprint*).
CONTENT_KEY, CONTENT_BITS = "content_sum", 2048
# The content sum of conversions written before it, over clip headers only (so a payload only through its
# CRC-32): read, and its fingerprint followed from it, never recomputed. A shard finished by such a release has
# no ``CONTENT_KEY``, so a rerun that finishes the conversion records no fingerprint rather than a mixed one.
LEGACY_CONTENT_KEY, LEGACY_CONTENT_BITS = "content", 256


def content_fingerprint(data: DataSpec, contents: Sequence[str], *, bits: int = CONTENT_BITS) -> str:
    """A conversion's content fingerprint (FORMAT.md, *Content fingerprint*) from its data settings and its
    shards' content sums (``convert.format.base.ContentSum``), in any order; ``bits``: the sums' width
    (``LEGACY_CONTENT_BITS`` for the sums of a conversion written before ``CONTENT_KEY``)."""
    settings = {k: v for k, v in data.to_dict().items() if k in FINGERPRINT_FIELDS}
    total = sum(int(c, 16) for c in contents) % (1 << bits)
    text = json.dumps(settings, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode() + total.to_bytes(bits // 8, "big")).hexdigest()


def recorded_content_sums(shards: Sequence[ShardEntry]) -> tuple[list[Any], int]:
    """The content sum each shard entry records (None where it records none) and the sums' width in bits: those
    under ``CONTENT_KEY``, or in a conversion written before it, under ``LEGACY_CONTENT_KEY``."""
    legacy = (not any(CONTENT_KEY in s.extras for s in shards)
              and any(LEGACY_CONTENT_KEY in s.extras for s in shards))
    key, bits = (LEGACY_CONTENT_KEY, LEGACY_CONTENT_BITS) if legacy else (CONTENT_KEY, CONTENT_BITS)
    return [s.extras.get(key) for s in shards], bits


def read_manifest(root: str) -> Manifest:
    """The manifest of a finished conversion at ``root``; one-line FormatError naming what is wrong."""
    if not os.path.isdir(root):
        raise FormatError(f"{root}: no such folder")
    path = os.path.join(root, MANIFEST)
    if not os.path.lexists(path):
        raise FormatError(f"{root}: no {MANIFEST}; not a finished conversion (run python -m convert first)")
    return Manifest.from_dict(read_json_file(path, "manifest"), path)


def shard_meta(data: DataSpec, *, index: int, count: int) -> dict[str, Any]:
    """The metadata a shard stores: format, the data-defining fields, its place among the shards."""
    return {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, "index": index, "count": count,
            **data.to_dict()}


def check_shard_meta(meta: dict | None, manifest: Manifest, index: int, where: str) -> None:
    """A shard's stored metadata must agree with the manifest and sit at its manifest position."""
    if meta is None:
        raise FormatError(f"{where}: shard has no metadata (not written by this format version)")
    want = manifest.data.to_dict()
    diffs = [k for k in DATA_KEYS if meta.get(k) != want.get(k)]
    if diffs:
        k = diffs[0]
        raise FormatError(f"{where}: shard says {k} {_short(meta.get(k))}, manifest says {_short(want.get(k))}"
                          f"{f' (also differ: {chr(44).join(diffs[1:])})' if diffs[1:] else ''}")
    if meta.get("index") != index:
        raise FormatError(f"{where}: shard is number {meta.get('index')} of its conversion, the manifest lists it "
                          f"as number {index} (shards reordered?)")
    count = meta.get("count", 0)
    if not isinstance(count, int) or count > len(manifest.shards):
        raise FormatError(f"{where}: shard belongs to a conversion of {count} shards, the manifest "
                          f"lists {len(manifest.shards)} (shards dropped from the manifest?)")


def check_plan(root: str, manifest: Manifest, *, digest: bool = False) -> None:
    """The manifest must list every shard the plan made, in the plan's order (when plan.json is there).

    A manifest that records its plan (``Manifest.plan``) is checked without
    parsing plan.json: the file's size must be the one recorded (one
    ``stat``: a plan rewritten since, say by a rerun adding videos that was
    stopped before its new manifest, has other shards and so another size),
    with ``digest`` its SHA-256 too (``verify``), and the shards recorded
    must be those the manifest lists. An older manifest is checked against
    the parsed plan.
    """
    path = os.path.join(root, PLAN)
    if not os.path.lexists(path):
        return
    if manifest.plan is not None:
        planned = list(manifest.plan.shards)
        _same_plan(path, manifest.plan, digest=digest)
    else:
        plan = read_json_file(path, "plan", limit=MAX_PLAN_BYTES)
        try:
            planned = [s["name"] for s in plan["shards"]]
        except (KeyError, TypeError) as exc:
            raise FormatError(f"{path}: not a readable plan: {type(exc).__name__}: {exc}") from exc
    listed = [s.name for s in manifest.shards]
    if listed != planned:
        missing = [n for n in planned if n not in listed]
        what = f"lacks {', '.join(missing[:3])}" if missing else "lists them in another order"
        raise FormatError(f"{os.path.join(root, MANIFEST)}: the plan has {len(planned)} shards, the manifest {what}")


def _same_plan(path: str, recorded: PlanRecord, *, digest: bool) -> None:
    """FormatError naming ``path`` when the plan there is not the one the manifest recorded."""
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise FormatError(f"{path}: the plan is not a regular file")
        size = st.st_size
        sha = file_sha256(path) if digest and size == recorded.bytes else None
    except OSError as exc:
        raise FormatError(f"{path}: reading the plan failed: {exc.strerror}") from None
    if size != recorded.bytes or (sha is not None and sha != recorded.sha256):
        what = f"{size} bytes, the manifest's plan {recorded.bytes}" if size != recorded.bytes else \
            "its SHA-256 differs from the manifest's record of it"
        raise FormatError(f"{path}: the plan changed since the manifest was written ({what}): a rerun of the job "
                          f"stopped before its new manifest? run it again to finish")


__all__ = ["CONTENT_BITS", "CONTENT_KEY", "DATA_KEYS", "FINGERPRINT_FIELDS", "LEGACY_CONTENT_BITS",
           "LEGACY_CONTENT_KEY", "ClipSettings", "DataSpec", "FrameSize", "Manifest", "PlanRecord",
           "ShardEntry", "ShardFile", "Totals", "check_plan", "check_shard_meta", "content_fingerprint",
           "read_manifest", "recorded_content_sums", "shard_meta"]
