"""The features of a clip's ``tf.train.Example``: defined once, for the writer, the readers and DALI's reader spec.

``FEATURES`` is FORMAT.md's feature table as data. The writer fills it
(``clip_features``); a reader that parses Examples itself checks the
redundant fields against the header; a DALI pipeline builds its
``fn.readers.tfrecord`` spec from it (``loaders.dali``), so the schema is
written in one place only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..layout import ClipHeader


@dataclass(frozen=True)
class Feature:
    """One feature: ``kind`` ``"bytes"`` or ``"int64"``; ``length`` the fixed number of values, or None (varies)."""

    name: str
    kind: str
    length: int | None
    doc: str


FEATURES: tuple[Feature, ...] = (
    Feature("header", "bytes", 1, "the clip's header bytes (36 + n)"),
    Feature("payload", "bytes", 1, "the clip's payload"),
    Feature("part_offsets", "int64", None, "byte offset inside payload of each separately coded part"),
    Feature("part_sizes", "int64", None, "byte size of each part"),
    Feature("shape", "int64", 4, "[T, H, W, C]"),
    Feature("label", "int64", 1, "the header's label"),
    Feature("video_id", "bytes", 1, "the header's video id"),
    Feature("clip_index", "int64", 1, "the header's clip index"),
    Feature("start_frame", "int64", 1, "the header's start frame"),
)
BY_NAME = {f.name: f for f in FEATURES}
# The features that repeat the header, and how each is read from a parsed header.
REPEATED: dict[str, Any] = {
    "shape": lambda h: list(h.shape), "label": lambda h: [h.label], "video_id": lambda h: h.video_id.encode("utf-8"),
    "clip_index": lambda h: [h.clip_index], "start_frame": lambda h: [h.start_frame],
}


def clip_features(header: bytes, payload: bytes | memoryview, parts: tuple[np.ndarray, np.ndarray],
                  head: ClipHeader) -> dict[str, tuple[str, object]]:
    """The Example features of one clip, ``name -> (kind, value)`` (``head``: the parsed header)."""
    values: dict[str, object] = {"header": header, "payload": payload, "part_offsets": parts[0].tolist(),
                                 "part_sizes": parts[1].tolist(),
                                 **{name: read(head) for name, read in REPEATED.items()}}
    return {f.name: (f.kind, values[f.name]) for f in FEATURES}


__all__ = ["BY_NAME", "FEATURES", "REPEATED", "Feature", "clip_features"]
