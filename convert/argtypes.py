"""Command-line pieces every ``python -m convert`` parser shares: one-line usage errors, size arguments."""

from __future__ import annotations

import argparse
import re
from typing import NoReturn

_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (the full usage is behind --help)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def parse_size(text: str) -> tuple[int, int]:
    m = re.fullmatch(r"(\d+)[xX](\d+)", text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"size must be HxW (height x width, e.g. 128x171), got {text!r}")
    return int(m.group(1)), int(m.group(2))


def parse_short_side(text: str) -> int:
    if not text.strip().isdigit() or not 2 <= int(text) <= 8192:
        raise argparse.ArgumentTypeError(f"must be a whole number of pixels in 2..8192 (the shorter side of "
                                         f"every frame; or give --size HxW), got {text!r}")
    return int(text)


def parse_bytes(text: str) -> int:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)i?[bB]?", text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"expected a byte count like 512M or 2G, got {text!r}")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


__all__ = ["OneLineParser", "parse_bytes", "parse_short_side", "parse_size"]
