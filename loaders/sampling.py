"""Sample specs: which frames of a video one sample is, chosen at read time from one conversion.

A conversion with the default clips is each video's frame timeline
(FORMAT.md, *Frame timeline*; ``ClipStore.frames``). A ``SampleSpec`` says
which of its frames make one sample, as the recipes of mmaction2, PySlowFast
and torchvision say it: T frames at step s, from a random window (training),
N uniform views (evaluation) or N segments (TSN), K samples per video per
epoch, and SlowFast's two pathways read as one. ``VideoSamples`` is the
index of such samples over a conversion and gives each sample's frame
indices, drawn from (seed, epoch, index) alone (``loaders.keyed``), so every
reader, worker, rank and resume point reads the same frames.

The spatial side (crop, flip, multi-scale, 3-crop) stays the ``ClipPreset``'s:
a reader assembles the sample's frames, then cuts them as it cuts a clip.
Torch-free.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .keyed import KeyedDraws

if TYPE_CHECKING:
    from convert.store import ClipStore

    from .presets import ClipPreset

RULES = ("clips", "window", "segments")
# What a sample of a video shorter than the span it needs holds: its frames looped (mmaction2's SampleFrames;
# torchvision's VideoClips drops such videos instead, which would lose them from evaluation).
SHORT_RULE = "loop"
# The draws of a sample's frames are keyed (seed, epoch, index, _TEMPORAL): apart from the preset's crop draws,
# keyed (seed, epoch, index).
_TEMPORAL = 1


def _count(name: str, value: Any, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    return value


@dataclass(frozen=True, kw_only=True)
class SampleSpec:
    """Which frames of a video one sample is (frozen, validated; ``to_dict`` is what a checkpoint stores).

    ``rule``:

    - ``"clips"`` (default): each stored clip is a sample, as the conversion
      cut them; ``frames`` (None: the stored clip length) at most the stored
      clip length and ``step`` 1 (the preset then takes a random window of
      the clip in training, the centre one in evaluation). Reads any
      conversion: the batches of a reader without a spec, bit for bit.
    - ``"window"``: ``frames`` frames at ``step`` from one window of span
      ``(frames - 1) * step + 1``: in training ``clips_per_video`` windows per
      video per epoch, each starting anywhere in the video; in evaluation
      ``views`` windows spread evenly (mmaction2's test offsets: view k starts
      at ``int((k + 0.5) * (L - span + 1) / views)``).
    - ``"segments"`` (TSN, TSM): the video cut into ``frames`` equal segments,
      one frame of each: a random one in training, the centre one in
      evaluation (with ``views`` N, view k takes the frame ``(k + 0.5) / N``
      of the way into each; ``step`` unused, 1).

    ``alpha`` (SlowFast): the sample is the fast pathway; the slow pathway is
    every ``alpha``-th of its frames (``slow_indices``), read once with it.
    A video shorter than the span a sample needs is sampled by ``SHORT_RULE``:
    its frames looped.
    """

    frames: int | None = None
    step: int = 1
    rule: str = "clips"
    clips_per_video: int = 1
    views: int = 1
    alpha: int | None = None

    def __post_init__(self) -> None:
        if self.frames is None and self.rule != "clips":
            raise ValueError(f"rule {self.rule!r} needs frames, the frames of one sample")
        if self.frames is not None:
            _count("frames", self.frames)
        _count("step", self.step)
        _count("clips_per_video", self.clips_per_video)
        _count("views", self.views)
        if self.rule not in RULES:
            raise ValueError(f"rule must be one of {', '.join(RULES)}, got {self.rule!r}")
        if self.rule in ("clips", "segments") and self.step != 1:
            raise ValueError(f"rule {self.rule!r} takes step 1 (its frames are the stored clip's, or one a "
                             f"segment), got {self.step}")
        if self.rule == "clips" and (self.clips_per_video, self.views) != (1, 1):
            raise ValueError("rule 'clips' reads each stored clip once: clips_per_video and views are for the "
                             "'window' and 'segments' rules")
        if self.alpha is not None:
            _count("alpha", self.alpha)
            if self.frames is None or self.frames % self.alpha:
                raise ValueError(f"the slow pathway takes every alpha-th frame of the fast one: alpha {self.alpha} "
                                 f"must divide frames {self.frames}")

    @property
    def length(self) -> int:
        """Frames of one sample (``frames``; rule ``"clips"`` without it: the stored clips', given by the reader,
        so asking here is a ValueError)."""
        if self.frames is None:
            raise ValueError("rule 'clips' without frames takes the stored clips' length")
        return self.frames

    @property
    def span(self) -> int:
        """Frames of the timeline one window covers: ``(frames - 1) * step + 1``."""
        return (self.length - 1) * self.step + 1

    def per_video(self, train: bool) -> int:
        """Samples per video per epoch (training: ``clips_per_video``; evaluation: ``views``)."""
        return self.clips_per_video if train else self.views

    def slow_indices(self) -> np.ndarray:
        """Which frames of a sample are the slow pathway's (SlowFast; every frame without ``alpha``)."""
        return np.arange(0, self.length, self.alpha or 1)

    def to_dict(self) -> dict[str, Any]:
        """The spec as plain values (what a checkpoint stores)."""
        return {"frames": self.frames, "step": self.step, "rule": self.rule,
                "clips_per_video": self.clips_per_video, "views": self.views, "alpha": self.alpha}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SampleSpec:
        """A spec from ``to_dict``'s values; ValueError in one line for anything else."""
        if not isinstance(d, Mapping):
            raise ValueError(f"a sample spec is a mapping, got {type(d).__name__}")
        unknown = sorted(set(d) - set(cls().to_dict()))
        if unknown:
            raise ValueError(f"unknown sample spec fields {unknown}")
        return cls(**d)

    def __str__(self) -> str:
        what = {"clips": f"stored clips, {self.frames or 'all'} frames",
                "window": f"{self.frames}x{self.step} windows",
                "segments": f"{self.frames} segments"}[self.rule]
        extra = f", slow pathway every {self.alpha}" if self.alpha else ""
        views = f"{self.views} view{'s' if self.views != 1 else ''}"
        return f"{what} ({self.clips_per_video} per video in training, {views} in evaluation{extra})"


class VideoSamples:
    """The samples of a ``SampleSpec`` over the videos of a conversion, and each one's frame indices.

    ``lengths``: each video's timeline length (``ClipStore.video_frames``).
    Sample ``i`` is of video ``i // per_video``; ``indices(epoch, i)`` its
    frames, a function of (``seed``, epoch, i) in training and of i alone in
    evaluation. Not for rule ``"clips"`` (its samples are the stored clips).
    """

    def __init__(self, *, spec: SampleSpec, lengths: np.ndarray, train: bool, seed: int = 0) -> None:
        if spec.rule == "clips":
            raise ValueError("rule 'clips' samples the stored clips: VideoSamples is for 'window' and 'segments'")
        self.spec, self.train, self.seed = spec, train, _count("seed", seed, 0)
        self.lengths = np.asarray(lengths, dtype=np.int64)
        if self.lengths.size and self.lengths.min() < 1:
            raise ValueError("every video needs at least one frame")
        self.per_video = spec.per_video(train)

    def __len__(self) -> int:
        return int(self.lengths.size) * self.per_video

    def video(self, i: int) -> int:
        """The video number of sample ``i``."""
        return i // self.per_video

    def starts(self, epoch: int, i: int) -> tuple[int, int]:
        """(video, first frame) of window sample ``i`` (rule ``"window"``)."""
        v = self.video(i)
        slack = int(self.lengths[v]) - self.spec.span + 1
        if slack <= 0:
            return v, 0
        if self.train:
            return v, KeyedDraws(self.seed, epoch, i, _TEMPORAL).integers(slack)
        k, n = i % self.per_video, self.per_video
        return v, int((k + 0.5) * slack / n)

    def indices(self, epoch: int, i: int) -> np.ndarray:
        """The timeline indices of sample ``i``'s ``frames`` frames (int64), in order."""
        if not 0 <= i < len(self):
            raise IndexError(f"sample {i} out of range for {len(self)} samples")
        spec = self.spec
        if spec.rule == "window":
            v, start = self.starts(epoch, i)
            idx = start + np.arange(spec.length, dtype=np.int64) * spec.step
        else:  # segments: TSN's offsets (mmaction2's SampleFrames with clip_len 1)
            v = self.video(i)
            length, n = int(self.lengths[v]), spec.length
            if self.train:
                draws = KeyedDraws(self.seed, epoch, i, _TEMPORAL)
                size = length / n
                idx = np.array([int(k * size) + draws.integers(max(1, int((k + 1) * size) - int(k * size)))
                                for k in range(n)], dtype=np.int64)
            else:  # view k of N: the frame (k + 0.5) / N of the way into each segment (N = 1: its centre)
                offset = (i % self.per_video + 0.5) / self.per_video
                idx = ((np.arange(n) + offset) * (length / n)).astype(np.int64)
        return idx % int(self.lengths[v])  # SHORT_RULE: a video shorter than the span loops

    def problem(self) -> str | None:
        """Why these videos cannot serve the spec at all, in one line (None: they can): a span longer than every
        video's timeline."""
        if self.spec.rule == "window" and self.lengths.size and self.spec.span > int(self.lengths.max()):
            return (f"a {self.spec.frames}x{self.spec.step} window spans {self.spec.span} frames, longer than every "
                    f"video (the longest has {int(self.lengths.max())})")
        return None


@dataclass(frozen=True)
class ReadPlan:
    """What a reader of a conversion reads for a spec and a preset (``plan_reads``): the ``spec``, the
    ``preset`` (its ``clip_len`` the spec's frames), ``samples`` (None: the stored clips are the samples) and
    ``frames``, the frames of one sample before the preset's window (a stored clip's, or the spec's)."""

    spec: SampleSpec
    preset: ClipPreset
    samples: VideoSamples | None
    frames: int


def plan_reads(store: ClipStore, preset: ClipPreset, spec: SampleSpec | None, *, train: bool) -> ReadPlan:
    """The one place a reader (``ClipDataset``, the DALI loaders) checks a spec and a preset against a
    conversion, before reading anything: ValueError in one line naming the conversion for a spec it cannot
    serve (clips that do not tile its videos, a span longer than every video), a preset that disagrees with the
    spec, or a crop that does not fit its frames."""
    spec = SampleSpec() if spec is None else spec
    if not isinstance(spec, SampleSpec):
        raise ValueError(f"spec must be a SampleSpec or None, got {type(spec).__name__}")
    if spec.frames is not None and preset.clip_len != spec.frames:
        if preset.clip_len is not None:
            raise ValueError(f"the preset's clip_len {preset.clip_len} disagrees with the spec's frames "
                             f"{spec.frames}")
        preset = dataclasses.replace(preset, clip_len=spec.frames)
    data = store.manifest.data
    frames = data.clip.clip_len
    samples = None
    if spec.rule != "clips":
        problem = data.timeline_problem()
        if problem is None:
            samples = VideoSamples(spec=spec, lengths=store.video_frames, train=train, seed=preset.seed)
            problem = samples.problem()
        if problem is not None:
            raise ValueError(f"{store.name}: cannot serve {spec}: {problem}")
        frames = spec.length
    elif preset.clip_len is not None and preset.clip_len > frames:
        raise ValueError(f"clip_len {preset.clip_len} is longer than the stored clips ({frames} frames)")
    if data.clip_shape:
        preset.params(0, 0, (frames, *data.clip_shape[1:]))  # a crop that cannot fit fails here, not in a reader
    return ReadPlan(spec, preset, samples, frames)


__all__ = ["RULES", "SHORT_RULE", "ReadPlan", "SampleSpec", "VideoSamples", "plan_reads"]
