"""Clip payload codecs: uint8 (T, H, W, C) arrays to bytes and back.

A codec is a small class in the ``CODECS`` dict; its ``id`` is what the value
header stores, so ids are part of the format and never reused.
"""

from __future__ import annotations

import io
import struct

import lz4.block
import numpy as np

from .format import FormatError


class RawCodec:
    """The array's bytes in C order: no CPU cost to read, largest on disk."""

    id = 0
    lossless = True

    def encode(self, clip: np.ndarray) -> memoryview:
        # A view, not a copy: the value is assembled with one copy in pack_value.
        return memoryview(np.ascontiguousarray(clip, dtype=np.uint8)).cast("B")

    def decode(self, payload: bytes | memoryview, shape: tuple[int, ...]) -> np.ndarray:
        expected = int(np.prod(shape))
        if len(payload) != expected:
            raise FormatError(f"raw payload is {len(payload)} bytes, shape {shape} needs {expected}")
        return np.frombuffer(payload, dtype=np.uint8).reshape(shape)


class Lz4Codec:
    """LZ4 block format without a size prefix: the layout DALI's GPU inflate reads.

    The decompressed size is the product of the header's shape, so no prefix
    is needed.
    """

    id = 1
    lossless = True

    def encode(self, clip: np.ndarray) -> bytes:
        return lz4.block.compress(np.ascontiguousarray(clip, dtype=np.uint8), store_size=False)

    def decode(self, payload: bytes | memoryview, shape: tuple[int, ...]) -> np.ndarray:
        size = int(np.prod(shape))
        try:
            raw = lz4.block.decompress(payload, uncompressed_size=size)
        except lz4.block.LZ4BlockError as exc:
            raise FormatError(f"lz4 payload does not decompress to {size} bytes: {exc}") from exc
        if len(raw) != size:
            raise FormatError(f"lz4 payload decompressed to {len(raw)} bytes, shape {shape} needs {size}")
        return np.frombuffer(raw, dtype=np.uint8).reshape(shape)


class JpegCodec:
    """One baseline JPEG per frame (lossy): about 10-30x smaller than raw.

    Payload: uint32 LE frame count N, N uint32 LE frame byte lengths, then the
    N JPEG files back to back.
    """

    id = 2
    lossless = False

    def __init__(self, quality: int = 90) -> None:
        if not 1 <= quality <= 100:
            raise ValueError(f"jpeg quality must be in 1..100, got {quality}")
        self.quality = quality

    def encode(self, clip: np.ndarray) -> bytes:
        from PIL import Image

        frames = []
        for frame in clip:
            buf = io.BytesIO()
            Image.fromarray(np.ascontiguousarray(frame)).save(buf, format="JPEG", quality=self.quality)
            frames.append(buf.getvalue())
        head = struct.pack(f"<I{len(frames)}I", len(frames), *(len(f) for f in frames))
        return head + b"".join(frames)

    def decode(self, payload: bytes | memoryview, shape: tuple[int, ...]) -> np.ndarray:
        from PIL import Image

        payload = memoryview(payload)
        (n,) = struct.unpack_from("<I", payload, 0)
        if n != shape[0]:
            raise FormatError(f"jpeg payload holds {n} frames, shape {shape} needs {shape[0]}")
        lengths = struct.unpack_from(f"<{n}I", payload, 4)
        out = np.empty(shape, dtype=np.uint8)
        pos = 4 + 4 * n
        for i, length in enumerate(lengths):
            img = Image.open(io.BytesIO(payload[pos:pos + length]))
            arr = np.asarray(img.convert("RGB"))
            if arr.shape != tuple(shape[1:]):
                raise FormatError(f"jpeg frame {i} is {arr.shape}, expected {tuple(shape[1:])}")
            out[i] = arr
            pos += length
        if pos != len(payload):
            raise FormatError(f"jpeg payload has {len(payload) - pos} trailing bytes")
        return out


CODECS = {"raw": RawCodec, "lz4": Lz4Codec, "jpeg": JpegCodec}
CODEC_BY_ID = {cls.id: name for name, cls in CODECS.items()}


def get_codec(name: str):
    """Instantiate a codec by name; the error lists the names allowed."""
    if name not in CODECS:
        raise ValueError(f"unknown codec {name!r}; choose one of {', '.join(CODECS)}")
    return CODECS[name]()


def codec_for_id(codec_id: int):
    if codec_id not in CODEC_BY_ID:
        raise FormatError(f"unknown codec id {codec_id}; known ids {sorted(CODEC_BY_ID)}")
    return CODECS[CODEC_BY_ID[codec_id]]()
