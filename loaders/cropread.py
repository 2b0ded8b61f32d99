"""The hot path: one stored clip value -> its preset crop, written into a given array.

Raw payloads are never copied whole: the crop is sliced straight out of the
LMDB memory map (``np.frombuffer`` on the value's memoryview) into the
caller's slot of a preallocated batch. LZ4 decompresses the clip once; JPEG
decodes only the frames of the temporal window.
"""

from __future__ import annotations

import io
import struct

import numpy as np

from convert.codecs import JpegCodec, RawCodec, codec_for_id
from convert.format import ClipHeader, FormatError, check_crc, unpack_header

from .presets import ClipPreset, CropParams, apply


def _jpeg_window(payload: memoryview, shape: tuple[int, ...], t0: int, length: int) -> np.ndarray:
    """Frames ``t0:t0+length`` of a JPEG payload (layout: convert.codecs.JpegCodec)."""
    from PIL import Image

    (n,) = struct.unpack_from("<I", payload, 0)
    if n != shape[0]:
        raise FormatError(f"jpeg payload holds {n} frames, header says {shape[0]}")
    lengths = struct.unpack_from(f"<{n}I", payload, 4)
    starts = np.concatenate(([4 + 4 * n], 4 + 4 * n + np.cumsum(lengths)))
    if int(starts[-1]) != len(payload):
        raise FormatError(f"jpeg payload is {len(payload)} bytes, its frame table says {int(starts[-1])}")
    out = np.empty((length, *shape[1:]), dtype=np.uint8)
    for k in range(length):
        a, b = int(starts[t0 + k]), int(starts[t0 + k + 1])
        img = Image.open(io.BytesIO(payload[a:b]))
        if img.mode != "RGB":
            img = img.convert("RGB")
        arr = np.asarray(img)
        if arr.shape != tuple(shape[1:]):
            raise FormatError(f"jpeg frame {t0 + k} is {arr.shape}, header says {tuple(shape[1:])}")
        out[k] = arr
    return out


def crop_value_into(value: memoryview | bytes, out: np.ndarray, preset: ClipPreset, epoch: int, index: int, *,
                    num_classes: int, verify: bool = False) -> ClipHeader:
    """Decode one stored value and write its crop for (epoch, index) into ``out``; returns the header.

    Data problems raise ``FormatError`` without a location; the caller
    (``ClipStore.visit_values``) adds the shard and key.
    """
    header = unpack_header(value)
    if verify:
        check_crc(value, header)
    if not 0 <= header.label < num_classes:
        raise FormatError(f"label {header.label} outside the {num_classes} classes of the manifest")
    try:
        params = preset.params(epoch, index, header.shape)
    except ValueError as exc:
        raise FormatError(f"stored clip of shape {header.shape} does not suit the preset: {exc}") from exc
    if params.t is None or out.shape[0] != params.t:
        raise FormatError(f"stored clip of {header.shape[0]} frames gives {params.t}, batch expects {out.shape[0]}")
    shape = header.shape
    if header.codec_id == RawCodec.id:
        size = shape[0] * shape[1] * shape[2] * shape[3]
        if header.payload_len != size:
            raise FormatError(f"raw payload is {header.payload_len} bytes, shape {shape} needs {size}")
        frames = np.frombuffer(value, dtype=np.uint8, count=size, offset=header.offset).reshape(shape)
    elif header.codec_id == JpegCodec.id:
        frames = _jpeg_window(memoryview(value)[header.offset:], shape, params.t0, params.t)
        params = CropParams(0, params.y0, params.x0, params.h, params.w, params.flip, t=params.t,
                            out_size=params.out_size)
    else:
        frames = codec_for_id(header.codec_id).decode(memoryview(value)[header.offset:], shape)
    try:
        apply(frames, params, out=out)
    except ValueError as exc:
        raise FormatError(str(exc)) from exc
    return header


__all__ = ["crop_value_into"]
