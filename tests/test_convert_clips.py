"""The clip cutter against FORMAT.md's definition of a video's clips, on numbered frames."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from convert.worker.clips import ClipCutter, ClipSpec, cut_clips


def _frames(n: int) -> list[np.ndarray]:
    """Frame i is a (2, 3, 3) uint8 array filled with i (mod 256) and its position, so a swap shows."""
    base = np.arange(18, dtype=np.uint8).reshape(2, 3, 3)
    return [(base + i * 7) % 251 for i in range(n)]


def _expected(frames: list[np.ndarray], spec: ClipSpec) -> list[tuple[int, int, np.ndarray]]:
    """FORMAT.md, "Clips of a video": clip k starts at k * step, its frame j is frame start + j * stride."""
    n, (t, s, d) = len(frames), (spec.clip_len, spec.stride, spec.start_step)
    if n >= spec.span:
        count = (n - spec.span) // d + 1
        if spec.max_clips:
            count = min(count, spec.max_clips)
        return [(k, k * d, np.stack([frames[k * d + j * s] for j in range(t)])) for k in range(count)]
    if n == 0 or spec.short == "skip":
        return []
    pick = (lambda i: i % n) if spec.short == "loop" else (lambda i: min(i, n - 1))
    return [(0, 0, np.stack([frames[pick(j * s)] for j in range(t)]))]


@pytest.mark.parametrize("short", ["skip", "loop", "repeat_last"])
def test_cut_clips_follow_the_format_definition(short):
    """Every combination of clip length, stride, step (overlapping, adjacent, with gaps) and max_clips."""
    for clip_len, stride, step, max_clips, n in itertools.product([1, 3, 4], [1, 2, 3], [None, 1, 2, 5, 9],
                                                                  [None, 2], range(0, 16)):
        spec = ClipSpec(clip_len=clip_len, stride=stride, step=step, max_clips=max_clips, short=short)
        frames = _frames(n)
        got = [(c.index, c.start_frame, c.frames) for c in cut_clips(iter(frames), spec)]
        want = _expected(frames, spec)
        assert [g[:2] for g in got] == [w[:2] for w in want], (n, spec)
        for g, w in zip(got, want):
            assert g[2].dtype == np.uint8 and g[2].flags.c_contiguous
            np.testing.assert_array_equal(g[2], w[2])


def test_frames_seen_counts_every_frame_pushed_after_max_clips():
    cutter = ClipCutter(ClipSpec(clip_len=2, max_clips=1))
    out = [cutter.push(f) for f in _frames(5)]
    assert [o is not None for o in out] == [False, True, False, False, False]
    assert cutter.done and cutter.frames_seen == 5 and cutter.padded() is None
