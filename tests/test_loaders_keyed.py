"""Keyed draws (``loaders.keyed``): the generator behind every crop, defined bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from loaders.keyed import GOLDEN, KeyedDraws, keyed_uniform, mix64, mix64_int

M = (1 << 64) - 1


def _spec_draws(key: tuple[int, ...], k: int) -> list[float]:
    """KeyedDraws as its docstring defines it, written out again from SplitMix64's published constants."""
    def mix(x: int) -> int:
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) % (1 << 64)
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) % (1 << 64)
        return x ^ (x >> 31)

    h = 0
    for part in key:
        h = mix(h ^ ((part + 0x9E3779B97F4A7C15) % (1 << 64)))
    return [(mix((h + j * 0x9E3779B97F4A7C15) % (1 << 64)) >> 11) / 2.0 ** 53 for j in range(1, k + 1)]


def test_the_two_forms_of_mix64_agree_bit_for_bit():
    values = np.random.default_rng(0).integers(0, 2**63, 1000, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    values = np.concatenate([values, np.array([0, 1, M, GOLDEN], dtype=np.uint64)])
    assert mix64(values).tolist() == [mix64_int(int(v)) for v in values]


def test_draws_follow_their_definition_and_are_pinned():
    for key in [(0, 0, 0), (7, 3, 12345), (2**40, 1, 0xC0, 9)]:
        d = KeyedDraws(*key)
        assert [d.uniform() for _ in range(5)] == _spec_draws(key, 5)
    # Pinned: a change of generator changes every crop of every run, so it must be on purpose.
    d = KeyedDraws(0, 0, 0)
    assert (d.uniform(), d.integers(100), d.integers(2)) == (0.6129305541874254, 45, 0)
    assert keyed_uniform((7, 3), np.arange(4), 1).tolist() == [_spec_draws((7, 3, i), 2)[1] for i in range(4)]


def test_integers_are_in_range_and_even():
    counts = np.bincount([KeyedDraws(1, e, i).integers(6) for e in range(6) for i in range(10_000)], minlength=6)
    assert counts.sum() == 60_000 and counts.size == 6
    assert np.all(np.abs(counts - 10_000) < 400)  # 4 standard deviations of a fair die's count
    with pytest.raises(ValueError, match="n must be >= 1"):
        KeyedDraws(0).integers(0)
    with pytest.raises(ValueError, match="key parts must be >= 0"):
        KeyedDraws(0, -1)
