"""Cut a stream of frames into fixed-length clips.

Streaming: only the frames the next clip still needs are kept, so a long video
never sits in memory whole.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np

SHORT_POLICIES = ("skip", "loop", "repeat_last")
TAIL_POLICIES = ("keep", "drop")


@dataclass(frozen=True)
class ClipSpec:
    """``clip_len`` frames ``stride`` apart; clip starts ``step`` apart (default: no overlap).

    ``tail``: where the clips tile the video (stride 1, step = clip_len),
    ``"keep"`` stores the frames after the last whole clip in one more clip,
    the video's last ``clip_len`` frames (FORMAT.md, *Clips of a video*), so
    the clips hold every frame of the video; ``"drop"`` leaves them out.
    Clips that do not tile the video drop them either way (``keeps_tail``).
    """

    clip_len: int = 16
    stride: int = 1
    step: int | None = None
    max_clips: int | None = None
    short: str = "skip"
    tail: str = "drop"

    def __post_init__(self) -> None:
        if not 1 <= self.clip_len <= 65535:
            raise ValueError(f"clip_len must be in 1..65535, got {self.clip_len}")
        if self.stride < 1:
            raise ValueError(f"stride must be >= 1, got {self.stride}")
        if self.step is not None and self.step < 1:
            raise ValueError(f"step must be >= 1, got {self.step}")
        if self.max_clips is not None and self.max_clips < 1:
            raise ValueError(f"max_clips must be >= 1, got {self.max_clips}")
        if self.short not in SHORT_POLICIES:
            raise ValueError(f"short policy must be one of {', '.join(SHORT_POLICIES)}, got {self.short!r}")
        if self.tail not in TAIL_POLICIES:
            raise ValueError(f"tail policy must be one of {', '.join(TAIL_POLICIES)}, got {self.tail!r}")

    @property
    def keeps_tail(self) -> bool:
        """Whether the frames after the last whole clip go into one more clip (``tail`` keep, on clips that tile
        the video)."""
        return self.tail == "keep" and self.stride == 1 and self.start_step == self.clip_len

    @property
    def span(self) -> int:
        """Source frames one clip covers, first to last."""
        return (self.clip_len - 1) * self.stride + 1

    @property
    def start_step(self) -> int:
        return self.step if self.step is not None else self.clip_len * self.stride

    def count(self, n_frames: int) -> int:
        """Clips a video of ``n_frames`` gives (short videos: 1 if padded, else 0)."""
        if n_frames < self.span:
            return 0 if self.short == "skip" or n_frames == 0 else 1
        n = (n_frames - self.span) // self.start_step + 1
        if self.keeps_tail and n_frames % self.clip_len:
            n += 1  # the tail clip
        return min(n, self.max_clips) if self.max_clips else n


@dataclass(frozen=True)
class Clip:
    index: int
    start_frame: int
    frames: np.ndarray  # (T, H, W, 3) uint8


class ClipCutter:
    """Feed frames in order; full clips come out as soon as their last frame arrives.

    Each frame is copied once, as it arrives, into the array of every clip it
    belongs to, rather than kept until its clip is complete and then stacked:
    the copy reads the frame while it is still in the CPU's cache, and the
    decoder gets its frame buffer back at once. A clip's array is allocated
    when its first frame arrives and handed out when its last one does;
    frames no clip uses are never copied.

    After the frames run out, ``padded()`` gives the one clip a short video gets
    under the loop / repeat_last policies, and ``frames_seen`` the frame count.
    """

    def __init__(self, spec: ClipSpec) -> None:
        self.spec = spec
        self.frames_seen = 0
        self.emitted = 0
        self._open: dict[int, np.ndarray] = {}  # clip index -> its array, being filled
        # Until the first clip is out, the frames themselves are kept (at most
        # span - 1 of them): a video that ends before then is padded from them.
        self._early: list[np.ndarray] | None = [] if spec.short != "skip" else None
        self._last: np.ndarray | None = None  # the last clip out, of which a tail clip takes the end

    @property
    def done(self) -> bool:
        """True once ``max_clips`` clips are out: the caller may stop decoding."""
        return self.spec.max_clips is not None and self.emitted >= self.spec.max_clips

    def _new_clip(self, frame: np.ndarray) -> np.ndarray:
        return np.empty((self.spec.clip_len, *frame.shape), dtype=frame.dtype)

    def push(self, frame: np.ndarray) -> Clip | None:
        s = self.spec
        idx = self.frames_seen
        self.frames_seen += 1
        if self.done:
            return None
        if self._early is not None:
            self._early.append(frame)
        step, span = s.start_step, s.span
        # Clip k holds frames k*step + j*stride (j < clip_len): this frame
        # belongs to each clip k not yet out with k*step <= idx < k*step + span.
        last = idx // step
        if s.max_clips is not None:
            last = min(last, s.max_clips - 1)
        for k in range(max(self.emitted, -(-(idx - span + 1) // step)), last + 1):
            j, off = divmod(idx - k * step, s.stride)
            if off == 0:
                clip = self._open.get(k)
                if clip is None:
                    clip = self._open[k] = self._new_clip(frame)
                clip[j] = frame
        start = self.emitted * step
        if idx != start + span - 1:
            return None
        out = Clip(self.emitted, start, self._open.pop(self.emitted))
        self.emitted += 1
        self._early = None
        if s.keeps_tail:
            self._last = out.frames  # a new array per clip, never written again: kept by reference
        return out

    def tail(self) -> Clip | None:
        """After the frames run out: the clip of the video's last ``clip_len`` frames, where frames came after the
        last whole clip and the spec keeps them (``keeps_tail``), else None. It starts at frame
        ``frames_seen - clip_len``: the end of the last whole clip, then the frames after it."""
        s = self.spec
        rest = self.frames_seen - self.emitted * s.clip_len
        if not s.keeps_tail or self._last is None or self.done or not 0 < rest < s.clip_len:
            return None
        after = self._open.pop(self.emitted)[:rest]
        frames = np.concatenate([self._last[rest:], after])
        out = Clip(self.emitted, self.frames_seen - s.clip_len, frames)
        self.emitted += 1
        self._last = None
        return out

    def padded(self) -> Clip | None:
        """The single clip of a video shorter than one clip, or None (skip policy)."""
        s = self.spec
        n = self.frames_seen
        if self.emitted or n == 0 or n >= s.span or self._early is None:
            return None
        want = [j * s.stride for j in range(s.clip_len)]
        if s.short == "loop":
            idx = [i % n for i in want]
        else:
            idx = [min(i, n - 1) for i in want]
        clip = self._new_clip(self._early[0])
        for j, i in enumerate(idx):
            clip[j] = self._early[i]
        self._open.clear()
        self.emitted = 1
        return Clip(0, 0, clip)


def cut_clips(frames: Iterable[np.ndarray], spec: ClipSpec) -> Iterator[Clip]:
    """All clips of a frame sequence, padded per the short policy when needed."""
    cutter = ClipCutter(spec)
    for frame in frames:
        clip = cutter.push(frame)
        if clip is not None:
            yield clip
        if cutter.done:
            return
    last = cutter.padded() or cutter.tail()
    if last is not None:
        yield last
