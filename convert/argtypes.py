"""Command-line pieces every ``python -m convert`` parser shares: one-line usage errors, checked numbers, sizes.

Every numeric option is checked as it is parsed (finite, in its range), so a
value such as ``nan``, ``inf``, ``0`` or ``100000`` is a one-line usage error
with status 2 before any work, never a job that runs with it.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from fractions import Fraction
from typing import NoReturn

_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
MAX_BYTES = (1 << 63) - 1  # what a size_t, off_t or rlimit of a 64-bit machine can hold


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (the full usage is behind --help)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def whole(lo: int, hi: int, what: str = "") -> Callable[[str], int]:
    """An argparse type: a whole number in ``lo..hi`` (``what`` says its unit, e.g. "seconds")."""
    unit = f" {what}" if what else ""

    def parse(text: str) -> int:
        if not re.fullmatch(r"\s*[+-]?[0-9]+\s*", text) or not lo <= int(text) <= hi:
            raise argparse.ArgumentTypeError(f"must be a whole number{unit} in {lo}..{hi}, got {text!r}")
        return int(text)

    parse.__name__ = "whole number"
    return parse


def number(lo: float, hi: float, what: str = "", *, above: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite number in ``[lo, hi]`` (``above``: greater than ``lo``, not equal)."""
    unit = f" {what}" if what else ""
    span = f"({lo:g}, {hi:g}]" if above else f"[{lo:g}, {hi:g}]"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or not (lo < value if above else lo <= value) or value > hi:
            raise argparse.ArgumentTypeError(f"must be a finite number{unit} in {span}, got {text!r}")
        return value

    parse.__name__ = "number"
    return parse


def parse_size(text: str) -> tuple[int, int]:
    m = re.fullmatch(r"(\d+)[xX](\d+)", text.strip())
    if not m or not all(2 <= int(n) <= 8192 for n in m.groups()):
        raise argparse.ArgumentTypeError(f"size must be HxW (height x width, each 2..8192, e.g. 128x171), "
                                         f"got {text!r}")
    return int(m.group(1)), int(m.group(2))


def parse_short_side(text: str) -> int:
    if not text.strip().isascii() or not text.strip().isdigit() or not 2 <= int(text) <= 8192:
        raise argparse.ArgumentTypeError(f"must be a whole number of pixels in 2..8192 (the shorter side of "
                                         f"every frame; or give --size HxW), got {text!r}")
    return int(text)


def parse_bytes(text: str) -> int:
    """A byte count like 512M, 2G or 1.5GiB, computed exactly (a huge one is no float infinity)."""
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)\s*([kKmMgGtT]?)i?[bB]?", text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"expected a byte count like 512M or 2G, got {text!r}")
    return int(Fraction(m.group(1)) * _UNITS[m.group(2).lower()])


def _in_units(n: int) -> str:
    """``n`` bytes as the largest unit that holds it exactly (256M), else as a plain number."""
    for unit, size in sorted(_UNITS.items(), key=lambda kv: -kv[1]):
        if n % size == 0:
            return f"{n // size}{unit.upper()}"
    return str(n)  # pragma: no cover - every count divides by 1


def byte_count(lo: int, hi: int = MAX_BYTES) -> Callable[[str], int]:
    """An argparse type: ``parse_bytes``, then within ``lo..hi`` bytes."""
    span = f"of at least {_in_units(lo)}" if hi == MAX_BYTES else f"from {_in_units(lo)} to {_in_units(hi)}"

    def parse(text: str) -> int:
        value = parse_bytes(text)
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"must be a byte count {span}, got {text!r}")
        return value

    parse.__name__ = "byte count"
    return parse


__all__ = ["MAX_BYTES", "OneLineParser", "byte_count", "number", "parse_bytes", "parse_short_side", "parse_size",
           "whole"]
