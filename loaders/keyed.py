"""Keyed draws: random numbers that are a function of a key such as (seed, epoch, index) alone.

Augmentation and sampling are keyed, never drawn from a stream, so a sample's
crop does not depend on which thread, worker, rank or resume point produced
it. The generator is SplitMix64's finaliser over the key (Steele, Lea and
Flood 2014): a few integer operations per draw. Not ``np.random.default_rng(key)``:
building its SeedSequence and PCG64 per key cost a loader a sizeable part of
each raw clip read while holding the GIL, serial across reader threads
(docs/benchmarks.md), and numpy does not promise that ``default_rng``'s stream
stays the same across versions; this one is defined here, bit for bit.

Two forms of one function: ``mix64`` on numpy uint64 arrays (vectorised
samplers) and ``mix64_int`` on Python ints (one clip's few draws, where numpy
scalars would cost more than they save); a test holds them equal.
"""

from __future__ import annotations

import numpy as np

GOLDEN = 0x9E3779B97F4A7C15  # 2^64 / golden ratio: SplitMix64's increment
_M64 = (1 << 64) - 1
_UNIT = 1.0 / (1 << 53)


def mix64(x: np.ndarray | np.uint64) -> np.ndarray | np.uint64:
    """SplitMix64's finaliser of each uint64 value (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        mixed: np.ndarray | np.uint64 = x ^ (x >> np.uint64(31))
        return mixed


def mix64_int(x: int) -> int:
    """``mix64`` of one value as a Python int in 0..2^64-1."""
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def _fold(key: tuple[int, ...]) -> int:
    """The hash of a key: its parts (ints >= 0) folded in order through ``mix64_int(h ^ (part + GOLDEN))``."""
    h = 0
    for part in key:
        if part < 0:
            raise ValueError(f"key parts must be >= 0, got {key}")
        h = mix64_int(h ^ ((int(part) + GOLDEN) & _M64))
    return h


class KeyedDraws:
    """The draws of one key: ``KeyedDraws(seed, epoch, index)``, then ``integers`` and ``uniform`` in turn.

    The key's parts (ints >= 0) are folded in order, each through
    ``mix64_int(h ^ (part + GOLDEN))`` from ``h = 0``; draw ``j`` (from 0) is
    ``mix64_int(h + (j + 1) * GOLDEN)``, its top 53 bits a uniform float
    ``u`` in [0, 1), and ``integers(n)`` is ``floor(u * n)`` (biased by at most
    n / 2^53).
    """

    __slots__ = ("_h", "_j")

    def __init__(self, *key: int) -> None:
        self._h, self._j = _fold(key), 0

    def uniform(self) -> float:
        """The next draw as a float in [0, 1)."""
        self._j += 1
        return (mix64_int((self._h + self._j * GOLDEN) & _M64) >> 11) * _UNIT

    def integers(self, n: int) -> int:
        """The next draw as an int in 0..n-1 (``n`` >= 1)."""
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        return int(self.uniform() * n)


def keyed_uniform(key: tuple[int, ...], index: np.ndarray, draw: int = 0) -> np.ndarray:
    """Draw ``draw`` of ``KeyedDraws(*key, i)`` for every ``i`` in ``index``, vectorised: floats in [0, 1)."""
    h = _fold(key)
    idx = np.asarray(index, dtype=np.uint64)
    with np.errstate(over="ignore"):
        hi = mix64(np.uint64(h) ^ (idx + np.uint64(GOLDEN)))
        bits = mix64(hi + np.uint64((draw + 1) * GOLDEN & _M64))
    unit: np.ndarray = (bits >> np.uint64(11)).astype(np.float64) * _UNIT
    return unit


__all__ = ["GOLDEN", "KeyedDraws", "keyed_uniform", "mix64", "mix64_int"]
