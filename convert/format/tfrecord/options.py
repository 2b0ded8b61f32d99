"""How the TFRecord backend stores (never what): the size at which a shard starts a new part."""

from __future__ import annotations

from dataclasses import dataclass

from ..options import check_settings, option
from ..units import MAX_BYTES


@dataclass(frozen=True)
class TFRecordOptions:
    """Writing options of the TFRecord backend, each declared once (its flag, help, default and range)."""

    part_bytes: int = option("tfrecord", "tfrecord: start a new .tfrecord file (with its DALI .idx) once one "
                                         "reaches this size", default=256 << 20, byte_count=True, ge=1,
                             le=MAX_BYTES, flag="--part-size", metavar="BYTES", field_default=True)

    def __post_init__(self) -> None:
        check_settings(self, ValueError)
