"""Clip presets: the one definition of crop, temporal window, flip and normalisation.

Every reader (the LMDB path here, a DALI path later) asks a ``ClipPreset`` for
``CropParams`` and applies them, so all readers feed the model the same pixels.
Augmentation is drawn from ``KeyedDraws(seed, epoch, index)`` (``loaders.keyed``):
a sample's crop depends only on the seed, the epoch and the sample's index,
never on which worker, rank or resume point produced it.

Everything on the CPU stays uint8; ``to_model_input`` is the single step that
turns a uint8 batch into normalised floats, on the device.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from .keyed import KeyedDraws

# torchvision's video models (r3d_18 etc., Kinetics-400): mean/std in 0..1,
# scaled here to 0..255 because the clips stay uint8 until the device.
KINETICS_MEAN = tuple(v * 255 for v in (0.43216, 0.394666, 0.37645))
KINETICS_STD = tuple(v * 255 for v in (0.22803, 0.22145, 0.216989))
SPATIAL_CROPS = (1, 3, 10)
# The aspect ratios (width / height) a random-resized crop draws from: torchvision's and mmaction2's.
RESIZED_RATIO = (3 / 4, 4 / 3)


@dataclass(frozen=True)
class CropParams:
    """Where to cut one clip: frames ``t0:t0+t``, rows ``y0:y0+h``, columns ``x0:x0+w``.

    ``flip`` mirrors left-right. ``out_size`` (H, W) is set when the cut is
    resized afterwards (multi-scale crop, short-side scale); ``None`` keeps
    the cut's size. ``antialias``: the resize filters as a downscale should
    (``resize_antialiased``: the short-side scale, which stands for resizing
    whole frames as a conversion does), else it samples bilinearly without
    (``resize_bilinear``: the multi-scale crop, OpenCV's INTER_LINEAR).
    ``t`` of ``None`` takes every frame from ``t0`` on.
    """

    t0: int
    y0: int
    x0: int
    h: int
    w: int
    flip: bool
    t: int | None = None
    out_size: tuple[int, int] | None = None
    antialias: bool = False


def _centre(total: int, part: int) -> int:
    # torchvision CenterCrop's rule: Python round() of half the slack, which
    # rounds halves to even (slack 59 -> 30, slack 5 -> 2).
    return int(round((total - part) / 2.0))


@dataclass(frozen=True, kw_only=True)
class ClipPreset:
    """What the model sees of a stored clip.

    ``clip_len``: frames fed to the model (``None``: all stored frames); a longer
    stored clip gives a random window in training and the centre window in
    evaluation. ``flip``: random left-right flip, training only. ``multiscale``:
    training only, as TSN / mmaction2 MultiScaleCrop: a square whose side is a
    scale (drawn from the tuple) times the frame's short side, at a uniformly
    random position, resized to ``crop_size`` by bilinear interpolation
    (half-pixel centres, no antialiasing, rounded to nearest: what OpenCV's
    INTER_LINEAR gives; a flip is applied before the resize). Without it,
    training takes a random ``crop_size`` square. Evaluation takes the centre ``crop_size`` square, rounded
    as torchvision's CenterCrop; with ``spatial_crops=3`` (the usual 3-crop
    test protocol) the item's epoch number selects one of three squares along
    the long side: 0 the first (left, or top when H > W), 1 the centre, 2 the
    last (right, or bottom); the short side is centred; with
    ``spatial_crops=10`` (TSN's and torchvision's TenCrop) 0-3 are the
    corners (top-left, top-right, bottom-left, bottom-right), 4 the centre and
    5-9 the same five flipped. ``mean``/``std`` are
    per RGB channel in 0..255 units.

    ``random_resized`` (lo, hi), training only (evaluation takes the
    centre crop_size square): Inception's random-resized crop, as
    torchvision's and mmaction2's RandomResizedCrop: a region of lo..hi of
    the frame's area and an aspect ratio in ``RESIZED_RATIO``, at a random
    place, resized to crop_size with a filtered downscale.

    ``short_side`` (lo, hi): the frames are taken as resized so that their
    short side is S before the crop, as PySlowFast's and PyTorchVideo's
    short-side scale does: in training S is drawn from lo..hi (its jitter;
    in the draw order's scale place), in evaluation it is lo (give (S, S)).
    What is read is the frame's region that becomes the crop_size square
    after such a resize, a square of ``round(crop_size * short / S)`` (at
    most the short side) resized to crop_size as ``multiscale``'s is, so the
    whole frames are never resized. Not with ``multiscale``; lo must be at
    least crop_size.
    """

    train: bool
    crop_size: int = 112
    clip_len: int | None = None
    flip: bool = True
    multiscale: tuple[float, ...] | None = None
    mean: tuple[float, ...] = field(default=KINETICS_MEAN)
    std: tuple[float, ...] = field(default=KINETICS_STD)
    seed: int = 0
    spatial_crops: int = 1
    short_side: tuple[int, int] | None = None
    random_resized: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.train, bool):
            raise ValueError(f"train must be True or False, got {self.train!r}")
        if not isinstance(self.flip, bool):
            raise ValueError(f"flip must be True or False, got {self.flip!r}")
        if not isinstance(self.crop_size, int) or not 1 <= self.crop_size <= 4096:
            raise ValueError(f"crop_size must be an int in 1..4096, got {self.crop_size!r}")
        if self.clip_len is not None and (not isinstance(self.clip_len, int) or self.clip_len < 1):
            raise ValueError(f"clip_len must be None (all stored frames) or an int >= 1, got {self.clip_len!r}")
        if self.multiscale is not None:
            scales = tuple(float(s) for s in self.multiscale)
            if not scales or not all(0.0 < s <= 1.0 for s in scales):
                raise ValueError(f"multiscale must be None or scales in (0, 1] of the short side, "
                                 f"e.g. (1.0, 0.875, 0.75, 0.66); got {self.multiscale!r}")
            object.__setattr__(self, "multiscale", scales)
        for name in ("mean", "std"):
            vals = tuple(float(v) for v in getattr(self, name))
            if len(vals) != 3 or not all(math.isfinite(v) for v in vals):
                raise ValueError(f"{name} must be 3 finite numbers (R, G, B in 0..255 units), got {vals}")
            object.__setattr__(self, name, vals)
        if min(self.std) <= 0:
            raise ValueError(f"std must be > 0 per channel, got {self.std}")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed must be an int >= 0, got {self.seed!r}")
        if self.short_side is not None:
            bounds = tuple(self.short_side)
            if len(bounds) != 2 or not all(isinstance(b, int) and not isinstance(b, bool) for b in bounds) \
                    or not self.crop_size <= bounds[0] <= bounds[1]:
                raise ValueError(f"short_side must be (lo, hi), integers with crop_size {self.crop_size} <= lo <= hi, "
                                 f"got {self.short_side!r}")
            object.__setattr__(self, "short_side", bounds)
        if self.random_resized is not None:
            area = tuple(float(a) for a in self.random_resized)
            if len(area) != 2 or not 0.0 < area[0] <= area[1] <= 1.0:
                raise ValueError(f"random_resized must be (lo, hi), fractions of the frame's area with 0 < lo <= hi "
                                 f"<= 1, e.g. (0.08, 1.0); got {self.random_resized!r}")
            object.__setattr__(self, "random_resized", area)
        scaling = [name for name in ("multiscale", "short_side", "random_resized") if getattr(self, name) is not None]
        if len(scaling) > 1:
            raise ValueError(f"{' and '.join(scaling)} are ways to scale the crop: give one")
        if self.spatial_crops not in SPATIAL_CROPS or (self.train and self.spatial_crops != 1):
            raise ValueError(f"spatial_crops must be one of {SPATIAL_CROPS} (3 and 10 for evaluation only), "
                             f"got {self.spatial_crops!r}")

    @property
    def resizes(self) -> bool:
        """Whether a cut may be resized to crop_size (``multiscale`` or ``random_resized`` in training,
        ``short_side``): what a reader that cuts and resizes in separate steps (DALI) asks."""
        return (self.train and (self.multiscale is not None or self.random_resized is not None)) \
            or self.short_side is not None

    def out_shape(self, stored_frames: int) -> tuple[int, int, int, int]:
        """(T, H, W, 3) of what ``apply`` returns for clips of ``stored_frames`` frames."""
        return (self.clip_len or stored_frames, self.crop_size, self.crop_size, 3)

    def params(self, epoch: int, index: int, shape: Sequence[int]) -> CropParams:
        """Crop of sample ``index`` in ``epoch`` for a stored clip of ``shape`` (T, H, W[, C]).

        Training draws, in this order: window start, scale (multiscale only),
        row, column, flip; the flip draw happens even with ``flip=False`` so
        switching flips off leaves the crops alone.
        """
        if len(shape) not in (3, 4):
            raise ValueError(f"shape must be (T, H, W) or (T, H, W, C), got {tuple(shape)}")
        t_all, h_all, w_all = (int(v) for v in shape[:3])
        length = self.clip_len or t_all
        if length > t_all:
            raise ValueError(f"clip_len {length} is longer than the stored clip ({t_all} frames)")
        if not self.train:
            out_size = None
            if self.short_side is not None:
                side = self._scaled_side(self.short_side[0], h_all, w_all)
                out_size = (self.crop_size, self.crop_size) if side != self.crop_size else None
            else:
                side = self._check_fits(self.crop_size, h_all, w_all)
            y0, x0 = _centre(h_all, side), _centre(w_all, side)
            flip = False
            if self.spatial_crops != 1 and not 0 <= epoch < self.spatial_crops:
                raise ValueError(f"with spatial_crops={self.spatial_crops} the item's epoch selects the crop "
                                 f"(0..{self.spatial_crops - 1}), got {epoch}")
            if self.spatial_crops == 3:
                if h_all > w_all:
                    y0 = (0, y0, h_all - side)[epoch]
                else:
                    x0 = (0, x0, w_all - side)[epoch]
            elif self.spatial_crops == 10:
                # torchvision's TenCrop: the four corners and the centre, then the same five flipped.
                y0, x0 = ((0, 0), (0, w_all - side), (h_all - side, 0), (h_all - side, w_all - side), (y0, x0))[
                    epoch % 5]
                flip = epoch >= 5
            return CropParams(_centre(t_all, length), y0, x0, side, side, flip, t=length, out_size=out_size,
                              antialias=out_size is not None)
        if epoch < 0 or index < 0:
            raise ValueError(f"epoch and index must be >= 0, got epoch {epoch}, index {index}")
        rng = KeyedDraws(self.seed, int(epoch), int(index))
        t0 = rng.integers(t_all - length + 1)
        if self.multiscale is not None:
            scale = self.multiscale[rng.integers(len(self.multiscale))]
            short = min(h_all, w_all)
            h = w = min(short, max(1, int(round(short * scale))))
        elif self.short_side is not None:
            lo, hi = self.short_side
            h = w = self._scaled_side(lo + rng.integers(hi - lo + 1), h_all, w_all)
        elif self.random_resized is not None:
            h, w = self._resized_region(rng, h_all, w_all, self.random_resized)
        else:
            h = w = self._check_fits(self.crop_size, h_all, w_all)
        out_size = None if (h, w) == (self.crop_size, self.crop_size) else (self.crop_size, self.crop_size)
        y0 = rng.integers(h_all - h + 1)
        x0 = rng.integers(w_all - w + 1)
        flip = rng.uniform() < 0.5 and self.flip
        return CropParams(t0, y0, x0, h, w, flip, t=length, out_size=out_size,
                          antialias=out_size is not None and self.multiscale is None)

    @staticmethod
    def _resized_region(rng: KeyedDraws, h_all: int, w_all: int, areas: tuple[float, float]) -> tuple[int, int]:
        """(h, w) of an Inception-style random-resized crop (torchvision's RandomResizedCrop, mmaction2's
        RandomResizedCrop): an area of ``areas`` of the frame's and an aspect ratio in ``RESIZED_RATIO``
        (drawn log-uniformly), up to ten tries, two draws each, for a region inside the frame; then the
        frame's centre at its aspect clamped into that range."""
        area = h_all * w_all
        lo, hi = (math.log(r) for r in RESIZED_RATIO)
        for _ in range(10):
            target = area * (areas[0] + rng.uniform() * (areas[1] - areas[0]))
            ratio = math.exp(lo + rng.uniform() * (hi - lo))
            w, h = int(round(math.sqrt(target * ratio))), int(round(math.sqrt(target / ratio)))
            if 0 < w <= w_all and 0 < h <= h_all:
                return h, w
        ratio = w_all / h_all
        if ratio < RESIZED_RATIO[0]:
            return int(round(w_all / RESIZED_RATIO[0])), w_all
        if ratio > RESIZED_RATIO[1]:
            return h_all, int(round(h_all * RESIZED_RATIO[1]))
        return h_all, w_all

    def _scaled_side(self, short_side: int, h: int, w: int) -> int:
        """The square of frames of h x w that becomes the crop_size square once the frames are resized to a
        short side of ``short_side``: ``round(crop_size * short / short_side)``, at most the short side."""
        short = min(h, w)
        return min(short, max(1, int(round(self.crop_size * short / short_side))))

    @staticmethod
    def _check_fits(side: int, h: int, w: int) -> int:
        if side > h or side > w:
            raise ValueError(f"crop_size {side} does not fit stored frames of {h}x{w}")
        return side

    def apply(self, clip: np.ndarray, params: CropParams, out: np.ndarray | None = None, *,
              first: int = 0) -> np.ndarray:
        """Same as the module's ``apply``; here for readers that hold only the preset."""
        return apply(clip, params, out=out, first=first)


def resize_bilinear(frames: np.ndarray, size: tuple[int, int], out: np.ndarray | None = None) -> np.ndarray:
    """Resize uint8 (T, H, W, C) frames to ``size`` (H, W): bilinear, half-pixel centres, no antialias."""
    t, h, w, c = frames.shape
    oh, ow = size

    def taps(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        src = (np.arange(n_out, dtype=np.float64) + 0.5) * (n_in / n_out) - 0.5
        src = np.clip(src, 0.0, n_in - 1)
        lo = np.floor(src).astype(np.intp)
        hi = np.minimum(lo + 1, n_in - 1)
        return lo, hi, (src - lo).astype(np.float32)

    y_lo, y_hi, fy = taps(h, oh)
    x_lo, x_hi, fx = taps(w, ow)
    src = frames.astype(np.float32)
    rows = src[:, y_lo] * (1.0 - fy)[None, :, None, None] + src[:, y_hi] * fy[None, :, None, None]
    res = rows[:, :, x_lo] * (1.0 - fx)[None, None, :, None] + rows[:, :, x_hi] * fx[None, None, :, None]
    if out is None:
        out = np.empty((t, oh, ow, c), dtype=np.uint8)
    np.clip(np.rint(res), 0, 255, out=res)
    out[...] = res
    return out


def resize_antialiased(frames: np.ndarray, size: tuple[int, int], out: np.ndarray | None = None) -> np.ndarray:
    """Resize uint8 (T, H, W, C) frames to ``size`` (H, W) with a bilinear (triangle) filter widened by the
    downscale factor, as FFmpeg's ``flags=bilinear`` scaler (the converter's) and DALI's antialiased linear
    resize filter a downscale: Pillow's ``BILINEAR`` resize, frame by frame."""
    from PIL import Image

    t, _, _, c = frames.shape
    oh, ow = size
    if out is None:
        out = np.empty((t, oh, ow, c), dtype=np.uint8)
    for k in range(t):
        frame = Image.fromarray(np.ascontiguousarray(frames[k]))
        out[k] = np.asarray(frame.resize((ow, oh), Image.Resampling.BILINEAR))
    return out


def apply(clip: np.ndarray, params: CropParams, out: np.ndarray | None = None, *, first: int = 0) -> np.ndarray:
    """Cut (and flip, and resize) ``clip`` as ``params`` say; uint8 in, new uint8 array out.

    With ``out`` the result is written there (it must have the output shape),
    which lets a batch be assembled in one preallocated array. ``first``: the
    stored frame that ``clip[0]`` is, when ``clip`` is a codec's temporal
    window rather than the whole stored clip (``params.t0`` counts stored
    frames).
    """
    if not isinstance(clip, np.ndarray) or clip.dtype != np.uint8 or clip.ndim != 4:
        raise ValueError(f"clip must be a uint8 numpy array (T, H, W, C), got "
                         f"{getattr(clip, 'dtype', type(clip))} {getattr(clip, 'shape', '')}")
    t_all, h_all, w_all, _ = clip.shape
    p = params
    t0 = p.t0 - first
    length = p.t if p.t is not None else t_all - t0
    if t0 < 0 or t0 + length > t_all or p.y0 < 0 or p.y0 + p.h > h_all or p.x0 < 0 or p.x0 + p.w > w_all:
        raise ValueError(f"crop {p} falls outside a clip of shape {clip.shape}" +
                         (f" holding stored frames from {first}" if first else ""))
    view = clip[t0:t0 + length, p.y0:p.y0 + p.h, p.x0:p.x0 + p.w]
    if p.out_size is not None and tuple(p.out_size) != (p.h, p.w):
        # Flip first, then resize: the resize gathers pixels anyway, so the
        # reversed view costs nothing extra there.
        resize = resize_antialiased if p.antialias else resize_bilinear
        return resize(view[:, :, ::-1] if p.flip else view, p.out_size, out=out)
    if out is None:
        out = np.empty(view.shape, dtype=np.uint8)  # never a view: the source may be a read buffer
    elif out.shape != view.shape:
        raise ValueError(f"out has shape {out.shape}, the crop is {view.shape}")
    if not p.flip:
        out[...] = view
    else:
        # One strided numpy copy per channel: exact, the same in any thread or
        # process, and it releases the GIL. Slower, measured against it
        # (docs/benchmarks.md): a reversed view copied whole (numpy then steps
        # through 3-byte pixels), a 3-byte void dtype, reversing bytes then
        # swapping R and B, and torch.flip, whose speed depends on torch's
        # process-wide thread count (its intra-op pool stalls when called from
        # many loader threads at once).
        for c in range(view.shape[3]):
            out[..., c] = view[:, :, ::-1, c]
    return out


@functools.lru_cache(maxsize=64)
def normalisation_tensors(mean: tuple[float, ...], std: tuple[float, ...], device: torch.device,
                          dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``mean`` and ``std`` as tensors on ``device``, made once per (values, device, dtype).

    Building them from Python numbers on every call would cost a host-to-device
    copy (and on CUDA a synchronisation) per micro-batch. Callers must not
    modify the returned tensors.
    """
    return (torch.tensor(mean, dtype=dtype, device=device), torch.tensor(std, dtype=dtype, device=device))


def to_model_input(clips: torch.Tensor, *, mean: Sequence[float], std: Sequence[float],
                   device: torch.device | str | None = None, channels_last: bool = False,
                   dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """uint8 (N, T, H, W, C) batch -> normalised ``(x - mean) / std`` float (N, C, T, H, W).

    The uint8 batch moves to ``device`` first (non-blocking, so pin it), which
    sends a quarter of the bytes a float batch would. With ``channels_last``
    the result keeps the NTHWC memory order (``torch.channels_last_3d``) and
    skips a copy; otherwise it is contiguous NCTHW.
    """
    if not isinstance(clips, torch.Tensor) or clips.dtype != torch.uint8 or clips.dim() != 5:
        raise ValueError(f"clips must be a uint8 tensor (N, T, H, W, C), got "
                         f"{getattr(clips, 'dtype', type(clips))} {tuple(getattr(clips, 'shape', ()))}")
    if len(mean) != clips.shape[-1] or len(std) != clips.shape[-1]:
        raise ValueError(f"mean and std need {clips.shape[-1]} values (one per channel), "
                         f"got {len(mean)} and {len(std)}")
    x = clips.to(device, non_blocking=True) if device is not None else clips
    m, s = normalisation_tensors(tuple(float(v) for v in mean), tuple(float(v) for v in std), x.device, dtype)
    # Normalise while channels are last: mean/std broadcast over the last dim.
    x = x.to(dtype).sub_(m).div_(s).permute(0, 4, 1, 2, 3)
    return x if channels_last else x.contiguous()


__all__ = ["KINETICS_MEAN", "KINETICS_STD", "ClipPreset", "CropParams", "apply", "normalisation_tensors",
           "resize_antialiased", "resize_bilinear", "to_model_input"]
