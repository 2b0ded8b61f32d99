"""Byte counts as people write them (``512M``, ``2G``, ``1.5GiB``): one parser for every command and setting; and
durations as progress lines say them."""

from __future__ import annotations

import re
from fractions import Fraction

UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
MAX_BYTES = (1 << 63) - 1  # what a size_t, off_t or rlimit of a 64-bit machine can hold


def parse_bytes(text: str) -> int:
    """A byte count like 512M, 2G or 1.5GiB (binary units), computed exactly (a huge one is no float infinity);
    a one-line ValueError otherwise."""
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)\s*([kKmMgGtT]?)i?[bB]?", text.strip())
    if not m:
        raise ValueError(f"expected a byte count like 512M or 2G, got {text!r}")
    return int(Fraction(m.group(1)) * UNITS[m.group(2).lower()])


def in_units(n: int) -> str:
    """``n`` bytes as the largest unit that holds it exactly (256M), else as a plain number."""
    for unit, size in sorted(UNITS.items(), key=lambda kv: -kv[1]):
        if n % size == 0:
            return f"{n // size}{unit.upper()}"
    return str(n)  # pragma: no cover - every count divides by 1


def duration(seconds: float) -> str:
    """``42 s``, ``3 min 05 s``, ``2 h 07 min``: how the converter's and the trainer's progress lines say a time."""
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


__all__ = ["MAX_BYTES", "UNITS", "duration", "in_units", "parse_bytes"]
