"""The hot path: one stored clip -> its preset crop, written into a given array.

The codec decodes only the crop's temporal window (raw payloads are not
copied at all: the window is a view of the shard's memory map); the preset
then cuts, flips and resizes it into the caller's slot of a preallocated
batch.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import numpy as np

from convert.format import ClipHeader, FormatError, check_crc, codec_for_id

from .presets import ClipPreset, CropParams, apply

if TYPE_CHECKING:
    from convert.store import ClipStore

    from .sampling import VideoSamples


def checked_params(header: ClipHeader, payload: memoryview, preset: ClipPreset, epoch: int, index: int, *,
                   verify: bool = False) -> CropParams:
    """The preset's crop of one stored clip for (epoch, index), after the checks every reader makes.

    ``verify`` checks the payload's CRC-32 first (``ClipStore.read`` has
    checked the label and shape); a payload decoded by FFmpeg is checked
    always (``Payload.crc_checked``). A clip the preset cannot crop
    raises ``FormatError`` without a location; the caller
    (``StoredClip.named``) adds the shard and clip.
    """
    # A training reader decodes in its own process (a process per clip would cost more than the decode): what
    # keeps a hostile bitstream from FFmpeg here is this check, and ``python -m convert verify``, which decodes
    # every clip in child processes, is the gate for data not trusted (docs/design.md).
    if codec_for_id(header.codec_id).payload.crc_checked(verify):
        check_crc(payload, header)
    try:
        return preset.params(epoch, index, header.shape)
    except ValueError as exc:
        raise FormatError(f"stored clip of shape {header.shape} does not suit the preset: {exc}") from exc


def crop_into(header: ClipHeader, payload: memoryview, out: np.ndarray, preset: ClipPreset, epoch: int,
              index: int, *, verify: bool = False) -> None:
    """Decode one stored clip and write its crop for (epoch, index) into ``out``.

    ``verify`` checks the payload's CRC-32; a payload read in place (raw) or
    decoded by FFmpeg is checked always. Data problems raise ``FormatError``
    without a location; the caller (``StoredClip.named``) adds the shard and
    clip.
    """
    codec = codec_for_id(header.codec_id)
    # A payload read in place is cut straight from the shard's map, the flipped crop channel by channel,
    # backwards: from memory, that order is slow. Streaming the payload through its CRC-32 first (a fast,
    # vectorised pass) leaves it in the CPU's caches for the crop, which then runs faster by more than the
    # check costs (docs/benchmarks.md): the check a user would have to ask for comes for less than free.
    params = checked_params(header, payload, preset, epoch, index, verify=verify or codec.payload.in_place)
    if params.t is None or out.shape[0] != params.t:
        raise FormatError(f"stored clip of {header.shape[0]} frames gives {params.t}, batch expects {out.shape[0]}")
    frames = codec.window(payload, header.shape, params.t0, params.t)
    try:
        apply(frames, params, out=out, first=params.t0)
    except ValueError as exc:
        raise FormatError(str(exc)) from exc


def _sample_params(store: ClipStore, samples: VideoSamples, preset: ClipPreset, epoch: int,
                   index: int) -> tuple[int, CropParams]:
    """(video, the preset's crop params) of sample ``index``: the frame size from the manifest, or from the
    video's first clip header (short-side conversions); a crop that does not fit is a FormatError naming the
    conversion and the video."""
    v = samples.video(index)
    shape = store.manifest.data.clip_shape
    h, w = shape[1:3] if shape else store.frame_shape(v)
    try:
        return v, preset.params(epoch, index, (samples.spec.length, h, w))
    except ValueError as exc:
        raise FormatError(f"{store.name}: video {store.video_ids[v]!r}: frames of {h}x{w} do not suit the "
                          f"preset: {exc}") from exc


def sample_region(store: ClipStore, samples: VideoSamples, preset: ClipPreset, epoch: int, index: int, *,
                  verify: bool = False, out: np.ndarray | None = None) -> tuple[int, np.ndarray, CropParams]:
    """Sample ``index`` of ``samples`` (a ``SampleSpec``'s samples of videos) for ``epoch``: (its video, its
    frames' crop region, the preset's params). The region is the cut the params say (rows ``y0:y0+h``, columns
    ``x0:x0+w`` of every frame), not yet flipped or resized: only it is ever copied out of a decoded frame.
    ``out``: the array to read it into when the params take the region as it is (neither flipped nor resized:
    the region is then ``out``); otherwise a new one."""
    v, p = _sample_params(store, samples, preset, epoch, index)
    as_is = not p.flip and (p.out_size is None or tuple(p.out_size) == (p.h, p.w))
    region = out if out is not None and as_is else np.empty((samples.spec.length, p.h, p.w, 3), dtype=np.uint8)
    store.frames(v, samples.indices(epoch, index), out=region, at=(p.y0, p.x0), verify=verify)
    return v, region, p


def sample_into(store: ClipStore, samples: VideoSamples, preset: ClipPreset, epoch: int, index: int,
                out: np.ndarray, *, verify: bool = False) -> int:
    """Sample ``index`` for ``epoch`` cut, flipped and resized by the preset into ``out`` (uint8 (T, S, S, C));
    its video number. A crop neither flipped nor resized is read into ``out`` directly."""
    v, region, p = sample_region(store, samples, preset, epoch, index, verify=verify, out=out)
    if region is not out:
        apply(region, dataclasses.replace(p, y0=0, x0=0), out=out)
    return v


__all__ = ["checked_params", "crop_into", "sample_into", "sample_region"]
