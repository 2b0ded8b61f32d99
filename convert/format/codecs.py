"""Clip payload codecs: uint8 (T, H, W, C) arrays to bytes and back.

A codec is one object that knows its payload: how to encode a clip, decode
it, decode only a temporal window (straight into a caller's array), where its
per-frame parts lie, and what the payload *is* (``Payload``: an array or
independently coded frames, how they are coded, lossless or not). Decoders
elsewhere (the GPU loader's graphs) are chosen from that declaration, never
by testing ids or classes. Readers look a codec up by the id in each value's
header (``CODECS_BY_ID``).

Ids are part of the format and never reused: 1 was the first release's
single-block LZ4 (retired with format version 1); LZ4 is one block per frame
(id 3), which DALI's GPU inflate decodes in parallel over frames.
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass
from typing import ClassVar

import lz4.block
import numpy as np

from .errors import FormatError


def _size(shape: tuple[int, ...]) -> int:
    t, h, w, c = shape
    return t * h * w * c


def _table(payload: memoryview, shape: tuple[int, ...], what: str) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, sizes) of the N parts of a payload laid out as: uint32 N, N uint32 sizes, the parts."""
    if len(payload) < 4:
        raise FormatError(f"{what} payload of {len(payload)} bytes has no part count")
    (n,) = struct.unpack_from("<I", payload, 0)
    if n != shape[0]:
        raise FormatError(f"{what} payload holds {n} frames, header says {shape[0]}")
    if len(payload) < 4 + 4 * n:
        raise FormatError(f"{what} payload of {len(payload)} bytes is shorter than its {n}-entry table")
    sizes = np.frombuffer(payload, dtype="<u4", count=n, offset=4).astype(np.int64)
    offsets = np.empty(n, dtype=np.int64)
    if n:
        offsets[0] = 4 + 4 * n
        np.cumsum(sizes[:-1], out=offsets[1:])
        offsets[1:] += offsets[0]
    end = int(offsets[-1] + sizes[-1]) if n else 4
    if end != len(payload):
        raise FormatError(f"{what} payload is {len(payload)} bytes, its frame table says {end}")
    return offsets, sizes


def _pack_parts(parts: list[bytes]) -> bytes:
    return struct.pack(f"<I{len(parts)}I", len(parts), *(len(p) for p in parts)) + b"".join(parts)


def _window_out(shape: tuple[int, ...], t0: int, t: int, out: np.ndarray | None) -> np.ndarray:
    if not (0 <= t0 and t >= 0 and t0 + t <= shape[0]):
        raise FormatError(f"frames {t0}:{t0 + t} fall outside a clip of {shape[0]} frames")
    want = (t, *shape[1:])
    if out is None:
        return np.empty(want, dtype=np.uint8)
    if out.shape != want or out.dtype != np.uint8:
        raise ValueError(f"out must be uint8 {want}, got {out.dtype} {out.shape}")
    return out


def _window_of(frames: np.ndarray, t0: int, t: int, out: np.ndarray | None) -> np.ndarray:
    """Frames ``t0:t0+t`` of whole decoded ``frames``: a view, or copied into ``out`` when given."""
    if out is None and 0 <= t0 and t0 + t <= frames.shape[0]:
        return frames[t0:t0 + t]
    out = _window_out(frames.shape, t0, t, out)
    out[...] = frames[t0:t0 + t]
    return out


@dataclass(frozen=True)
class Payload:
    """What a codec's payload is (FORMAT.md, *Payloads*): what a decoder is chosen by.

    ``layout``: ``"array"``, the clip's T*H*W*C bytes in one piece (coded as
    a whole), or ``"frames"``, uint32 N, N uint32 part sizes and N parts, part
    j coding frame j alone (so a temporal window decodes only its frames).
    ``coding``: how the array or each frame is coded, ``"none"`` (the bytes
    themselves), ``"lz4-block"`` (one LZ4 block, no size prefix) or
    ``"jpeg"`` (a baseline JPEG file, which carries its own size).
    ``lossless``: decoding gives back the clip's exact bytes.
    """

    layout: str
    coding: str
    lossless: bool

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"payload layout must be one of {', '.join(LAYOUTS)}, got {self.layout!r}")
        if self.coding not in CODINGS:
            raise ValueError(f"payload coding must be one of {', '.join(CODINGS)}, got {self.coding!r}")

    @property
    def in_place(self) -> bool:
        """The payload is the clip's pixels as they are: a reader takes a view of it, no decoding."""
        return self.layout == "array" and self.coding == "none"


LAYOUTS = ("array", "frames")
CODINGS = ("none", "lz4-block", "jpeg")


class Codec:
    """What every payload codec offers; subclasses fill it in."""

    name: ClassVar[str] = ""
    id: ClassVar[int] = -1
    summary: ClassVar[str] = ""  # what it stores, in a few words (the command line's help)
    payload: ClassVar[Payload]
    # Raw bytes per stored byte a conversion can count on (at least): sizes the
    # free-space estimate before any video is encoded. 1.0 when nothing is known.
    expected_ratio: ClassVar[float] = 1.0

    def encode(self, clip: np.ndarray) -> bytes | memoryview:
        """The payload of one uint8 (T, H, W, C) clip."""
        raise NotImplementedError(f"codec {self.name} (id {self.id}) is read-only")

    def decode(self, payload: bytes | memoryview, shape: tuple[int, ...]) -> np.ndarray:
        """The whole clip as uint8 (T, H, W, C)."""
        return self.window(payload, shape, 0, shape[0])

    def window(self, payload: bytes | memoryview, shape: tuple[int, ...], t0: int, t: int,
               out: np.ndarray | None = None) -> np.ndarray:
        """Frames ``t0:t0+t`` as uint8 (t, H, W, C), written into ``out`` when given.

        Only the window's frames are decoded where the payload allows it.
        """
        raise NotImplementedError

    def parts(self, payload: bytes | memoryview, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        """(offsets, sizes) int64: the byte ranges of ``payload`` coded separately, one per frame or one in all."""
        return np.zeros(1, np.int64), np.full(1, len(payload), np.int64)

    def window_parts(self, payload: bytes | memoryview, shape: tuple[int, ...], t0: int,
                     t: int) -> tuple[np.ndarray, np.ndarray, int]:
        """(offsets, sizes, skip): the parts to decode for frames ``t0:t0+t``, and how many decoded
        frames to drop before the window starts (0 where each frame is its own part)."""
        offsets, sizes = self.parts(payload, shape)
        if len(offsets) == shape[0]:
            return offsets[t0:t0 + t], sizes[t0:t0 + t], 0
        return offsets, sizes, t0

    def __repr__(self) -> str:
        return f"<codec {self.name} id {self.id}>"


class RawCodec(Codec):
    """The array's bytes in C order: no CPU cost to read, largest on disk."""

    name, id = "raw", 0
    summary = "the pixels as they are"
    payload = Payload(layout="array", coding="none", lossless=True)

    def encode(self, clip: np.ndarray) -> memoryview:
        # A view, not a copy: the value is assembled with one copy by the writer.
        return memoryview(np.ascontiguousarray(clip, dtype=np.uint8)).cast("B")  # type: ignore[arg-type]

    def frames(self, payload: bytes | memoryview, shape: tuple[int, ...]) -> np.ndarray:
        """The stored clip as a read-only view of ``payload`` (no copy)."""
        size = _size(shape)
        if len(payload) != size:
            raise FormatError(f"raw payload is {len(payload)} bytes, shape {shape} needs {size}")
        return np.frombuffer(payload, dtype=np.uint8, count=size).reshape(shape)

    def decode(self, payload: bytes | memoryview, shape: tuple[int, ...]) -> np.ndarray:
        return self.frames(payload, shape)

    def window(self, payload: bytes | memoryview, shape: tuple[int, ...], t0: int, t: int,
               out: np.ndarray | None = None) -> np.ndarray:
        return _window_of(self.frames(payload, shape), t0, t, out)


class PerFrameCodec(Codec):
    """A payload of one independently coded part per frame: uint32 N, N uint32 sizes, the N parts."""

    def parts(self, payload: bytes | memoryview, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        return _table(memoryview(payload), shape, self.name)

    def decode_frame(self, part: memoryview, shape: tuple[int, ...], j: int) -> np.ndarray:
        """Frame ``j`` from its part, as uint8 (H, W, C); FormatError when it does not decode to that."""
        raise NotImplementedError

    def decode_frame_into(self, part: memoryview, shape: tuple[int, ...], j: int, out: np.ndarray) -> None:
        """Frame ``j`` from its part, written into ``out`` (uint8 (H, W, C)); codecs that can decode in
        place override it."""
        out[...] = self.decode_frame(part, shape, j)

    def window(self, payload: bytes | memoryview, shape: tuple[int, ...], t0: int, t: int,
               out: np.ndarray | None = None) -> np.ndarray:
        # Each frame is decoded straight into its row of ``out``: a fresh array
        # per frame, freed at once, costs page faults and, with several reader
        # threads in one process, stalls them all (two threads scaled far
        # better decoding in place: docs/benchmarks.md).
        view = memoryview(payload)
        offsets, sizes = self.parts(view, shape)
        out = _window_out(shape, t0, t, out)
        starts, lengths = offsets[t0:t0 + t].tolist(), sizes[t0:t0 + t].tolist()
        for k in range(t):
            self.decode_frame_into(view[starts[k]:starts[k] + lengths[k]], shape, t0 + k, out[k])
        return out


class Lz4FramesCodec(PerFrameCodec):
    """LZ4, one block per frame: uint32 N, N uint32 block sizes, then the N blocks.

    Each block decompresses to one H x W x C frame. Per-frame blocks let a
    reader decode only a temporal window, and DALI's GPU inflate decompress
    a clip's frames in parallel (one ~1 MB block per clip left the GPU mostly
    idle). Lossless; about 1.2x smaller than raw on typical Kinetics footage.
    """

    name, id = "lz4", 3
    summary = "an LZ4 block per frame, lossless, inflated on the GPU by DALI"
    payload = Payload(layout="frames", coding="lz4-block", lossless=True)
    expected_ratio = 1.2  # typical Kinetics footage; far more on synthetic or static video

    def encode(self, clip: np.ndarray) -> bytes:
        clip = np.ascontiguousarray(clip, dtype=np.uint8)
        return _pack_parts([lz4.block.compress(frame, store_size=False) for frame in clip])

    def decode_frame(self, part: memoryview, shape: tuple[int, ...], j: int) -> np.ndarray:
        out = np.empty(tuple(shape[1:]), dtype=np.uint8)
        self.decode_frame_into(part, shape, j, out)
        return out

    def decode_frame_into(self, part: memoryview, shape: tuple[int, ...], j: int, out: np.ndarray) -> None:
        # cramjam decompresses an LZ4 block into the caller's memory without the
        # GIL; python-lz4 returns a new bytes object per frame (see window).
        import cramjam

        frame = shape[1] * shape[2] * shape[3]
        if not out.flags.c_contiguous:
            return super().decode_frame_into(part, shape, j, out)
        try:
            # numpy's stubs declare ndarray's buffer protocol (__buffer__) only for Python >= 3.12; mypy checks as 3.10
            n = cramjam.lz4.decompress_block_into(part, out.reshape(-1), output_len=frame)  # type: ignore[arg-type]
        except cramjam.DecompressionError as exc:
            raise FormatError(f"lz4 frame {j} does not decompress to {frame} bytes: {exc}") from exc
        if n != frame:
            raise FormatError(f"lz4 frame {j} decompressed to {n} bytes, needs {frame}")


class JpegCodec(PerFrameCodec):
    """One baseline JPEG per frame (lossy): about 10-30x smaller than raw.

    Payload: uint32 LE frame count N, N uint32 LE frame byte lengths, then the
    N JPEG files back to back (quality 90, 4:2:0 chroma). Pixels are defined
    by libjpeg-turbo's default decoding (islow IDCT, fancy upsampling), which
    simplejpeg (the reader here), Pillow and DALI's CPU decoder all give bit
    for bit; nvJPEG on the GPU differs by a grey level or two.
    """

    name, id = "jpeg", 2
    summary = "a JPEG per frame, lossy, decoded by nvJPEG under DALI"
    payload = Payload(layout="frames", coding="jpeg", lossless=False)
    expected_ratio = 8.0

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
        return _pack_parts(frames)

    def decode_frame(self, part: memoryview, shape: tuple[int, ...], j: int) -> np.ndarray:
        # simplejpeg: libjpeg-turbo (bundled in its wheel) called without the
        # GIL, with its default islow IDCT and fancy upsampling, so the pixels
        # are Pillow's bit for bit (tested); the fastest per frame of the
        # decoders tried (PyTurboJPEG needs a system libturbojpeg; Pillow holds
        # the GIL): docs/benchmarks.md.
        import simplejpeg

        try:
            arr: np.ndarray = simplejpeg.decode_jpeg(part, colorspace="RGB", fastdct=False, fastupsample=False)
        except ValueError as exc:  # simplejpeg's error for undecodable data (strict: warnings too)
            raise FormatError(f"jpeg frame {j} cannot be decoded: {exc}") from exc
        if arr.shape != tuple(shape[1:]):
            raise FormatError(f"jpeg frame {j} is {arr.shape}, header says {tuple(shape[1:])}")
        return arr

    def decode_frame_into(self, part: memoryview, shape: tuple[int, ...], j: int, out: np.ndarray) -> None:
        import simplejpeg

        if out.flags.c_contiguous and out.shape == tuple(shape[1:]):
            try:
                arr = simplejpeg.decode_jpeg(part, colorspace="RGB", fastdct=False, fastupsample=False, buffer=out)
                if arr.shape == out.shape:
                    return
            except ValueError:
                pass  # undecodable, or larger than the frame: decode_frame says which
        out[...] = self.decode_frame(part, shape, j)


# Codecs a conversion can be written with, by the name the manifest stores.
WRITE_CODECS: dict[str, type[Codec]] = {"raw": RawCodec, "lz4": Lz4FramesCodec, "jpeg": JpegCodec}
# Every codec a reader may meet, by the id in a value's header.
CODECS_BY_ID: dict[int, Codec] = {c.id: c() for c in (RawCodec, JpegCodec, Lz4FramesCodec)}


def get_codec(name: str) -> Codec:
    """The codec new conversions write under ``name``; the error lists the names allowed."""
    if name not in WRITE_CODECS:
        raise ValueError(f"unknown codec {name!r}; choose one of {', '.join(WRITE_CODECS)}")
    return WRITE_CODECS[name]()


def codec_for_id(codec_id: int) -> Codec:
    """The codec of a stored value's header id."""
    codec = CODECS_BY_ID.get(codec_id)
    if codec is None:
        raise FormatError(f"unknown codec id {codec_id}; known ids {sorted(CODECS_BY_ID)}")
    return codec
