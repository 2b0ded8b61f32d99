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
from collections.abc import Sequence

import lz4.block
import numpy as np

from .errors import FormatError
from .payload import Codec, Payload, _picks_out, _window_of, _window_out
from .video import H264Codec, Vp9Codec


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
        return self.frames_at(payload, shape, range(t0, t0 + t), _window_out(shape, t0, t, out))

    def frames_at(self, payload: bytes | memoryview, shape: tuple[int, ...], picks: Sequence[int],
                  out: np.ndarray, *, at: tuple[int, int] = (0, 0)) -> np.ndarray:
        # Only the frames picked are decoded, each once (a repeat is copied). A whole frame is decoded straight
        # into its row of ``out``: a fresh array per frame, freed at once, costs page faults and, with several
        # reader threads in one process, stalls them all (two threads scaled far better decoding in place:
        # docs/benchmarks.md); a cropped one goes through one scratch frame.
        js = _picks_out(shape, picks, out, at)
        view = memoryview(payload)
        offsets, sizes = self.parts(view, shape)
        whole = tuple(out.shape[1:3]) == tuple(shape[1:3])
        y0, x0 = at
        h, w = out.shape[1:3]
        scratch = None if whole else np.empty(tuple(shape[1:]), dtype=np.uint8)
        done: dict[int, int] = {}
        for k, j in enumerate(js):
            if j in done:
                out[k] = out[done[j]]
                continue
            part = view[int(offsets[j]):int(offsets[j] + sizes[j])]
            if scratch is None:
                self.decode_frame_into(part, shape, j, out[k])
            else:
                self.decode_frame_into(part, shape, j, scratch)
                out[k] = scratch[y0:y0 + h, x0:x0 + w]
            done[j] = k
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
    quality_range, default_quality = (1, 100), 90

    def encode(self, clip: np.ndarray) -> bytes:
        from PIL import Image

        frames = []
        for frame in clip:
            buf = io.BytesIO()
            Image.fromarray(np.ascontiguousarray(frame)).save(buf, format="JPEG", quality=self.quality)
            frames.append(buf.getvalue())
        return _pack_parts(frames)

    def check_framing(self, payload: bytes | memoryview, shape: tuple[int, ...], offsets: np.ndarray,
                      sizes: np.ndarray) -> None:
        view = memoryview(payload)
        for j, (at, n) in enumerate(zip(offsets.tolist(), sizes.tolist())):
            self._check_size(view[at:at + n], shape, j)

    def _check_size(self, part: memoryview, shape: tuple[int, ...], j: int) -> None:
        """FormatError when JPEG ``part`` (frame ``j``, or the ``j``-th handed over) is not of the clip's size, read
        from its own header: before a pixel of it is allocated."""
        import simplejpeg

        try:
            height, width = simplejpeg.decode_jpeg_header(part)[:2]
        except ValueError as exc:
            raise FormatError(f"jpeg frame {j} cannot be decoded: {exc}") from exc
        if (height, width, 3) != tuple(shape[1:]):
            raise FormatError(f"jpeg frame {j} is {(height, width, 3)}, header says {tuple(shape[1:])}")

    def decode_frame(self, part: memoryview, shape: tuple[int, ...], j: int) -> np.ndarray:
        # simplejpeg: libjpeg-turbo (bundled in its wheel) called without the
        # GIL, with its default islow IDCT and fancy upsampling, so the pixels
        # are Pillow's bit for bit (tested); the fastest per frame of the
        # decoders tried (PyTurboJPEG needs a system libturbojpeg; Pillow holds
        # the GIL): docs/benchmarks.md.
        import simplejpeg

        self._check_size(part, shape, j)
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
WRITE_CODECS: dict[str, type[Codec]] = {"raw": RawCodec, "lz4": Lz4FramesCodec, "jpeg": JpegCodec,
                                        "h264": H264Codec, "vp9": Vp9Codec}
# Every codec a reader may meet, by the id in a value's header (the quality is the writer's: decoding ignores it).
CODECS_BY_ID: dict[int, Codec] = {c.id: c() for c in (RawCodec, JpegCodec, Lz4FramesCodec, H264Codec, Vp9Codec)}


def get_codec(name: str, quality: int | None = None) -> Codec:
    """The codec new conversions write under ``name``, at ``quality`` (its own scale; None: its default); the
    error lists the names allowed, or says the quality's range."""
    if name not in WRITE_CODECS:
        raise ValueError(f"unknown codec {name!r}; choose one of {', '.join(WRITE_CODECS)}")
    return WRITE_CODECS[name](quality)


def codec_for_id(codec_id: int) -> Codec:
    """The codec of a stored value's header id."""
    codec = CODECS_BY_ID.get(codec_id)
    if codec is None:
        raise FormatError(f"unknown codec id {codec_id}; known ids {sorted(CODECS_BY_ID)}")
    return codec
