"""Command-line pieces every ``python -m convert`` parser shares: one-line usage errors, checked numbers, sizes.

Every numeric option is checked as it is parsed (finite, in its range), so a
value such as ``nan``, ``inf``, ``0`` or ``100000`` is a one-line usage error
with status 2 before any work, never a job that runs with it.
"""

from __future__ import annotations

import argparse
import difflib
import math
import re
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from .format.units import MAX_BYTES, in_units
from .format.units import parse_bytes as _parse_bytes


class OneLineParser(argparse.ArgumentParser):
    """argparse whose usage errors are one line, ``MESSAGE (see PROG --help)``, with a mistyped option named
    together with the closest one there is; every command of the project (convert's and train's) parses with it.

    ``raise_as``: the caller's error policy. An exception type: the parser
    raises it with the line, and the entry point prints it and exits with
    status 2 (the trainer: ``TrainError``). None (the default): the parser
    prints ``PROG: error: LINE`` to stderr and exits with status 2 itself.
    """

    def __init__(self, *args: Any, raise_as: type[Exception] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.raise_as = raise_as

    def error(self, message: str) -> NoReturn:
        line = f"{message} (see {self.prog} --help)"
        if self.raise_as is not None:
            raise self.raise_as(line)
        self.exit(2, f"{self.prog}: error: {line}\n")

    def parse_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        parsed, extra = self.parse_known_args(args, namespace)
        if extra:
            self.error(self.unrecognized(extra))
        return parsed

    def unrecognized(self, extra: Sequence[str]) -> str:
        """The message for arguments no option took: the first unknown option and the closest known one."""
        unknown = next((a.split("=", 1)[0] for a in extra if a.startswith("-") and not _is_number(a)), None)
        if unknown is None:
            return f"unrecognized arguments: {' '.join(extra)}"
        known = [s for a in self._actions for s in a.option_strings if s.startswith("--")]
        close = difflib.get_close_matches(unknown, known, n=1, cutoff=0.6)
        return f"unrecognized option {unknown}" + (f"; did you mean {close[0]}?" if close else "")


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


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
    """An argparse type: a byte count like 512M, 2G or 1.5GiB (``convert.format.units.parse_bytes``)."""
    try:
        return _parse_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def byte_count(lo: int, hi: int = MAX_BYTES) -> Callable[[str], int]:
    """An argparse type: ``parse_bytes``, then within ``lo..hi`` bytes."""
    span = f"of at least {in_units(lo)}" if hi == MAX_BYTES else f"from {in_units(lo)} to {in_units(hi)}"

    def parse(text: str) -> int:
        value = parse_bytes(text)
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"must be a byte count {span}, got {text!r}")
        return value

    parse.__name__ = "byte count"
    return parse


__all__ = ["MAX_BYTES", "OneLineParser", "byte_count", "number", "parse_bytes", "parse_short_side", "parse_size",
           "whole"]
