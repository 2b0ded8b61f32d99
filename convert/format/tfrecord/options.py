"""How the TFRecord backend stores (never what): the size at which a shard starts a new part."""

from __future__ import annotations

import sys
from dataclasses import dataclass

from ..base import option


@dataclass(frozen=True)
class TFRecordOptions:
    """Writing options of the TFRecord backend."""

    part_bytes: int = option(256 << 20, flag="--part-size", parse="bytes",
                             help="tfrecord: start a new .tfrecord file (with its DALI .idx) once one reaches this "
                                  "size (default 256M)")

    def __post_init__(self) -> None:
        if isinstance(self.part_bytes, bool) or not isinstance(self.part_bytes, int) \
                or not 1 <= self.part_bytes <= sys.maxsize:
            raise ValueError(f"part_bytes must be an integer of 1..{sys.maxsize} bytes, got {self.part_bytes!r}")
