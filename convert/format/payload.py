"""What a clip payload codec is: the ``Codec`` interface and the ``Payload`` it declares.

The built-in codecs are in ``codecs`` (raw, lz4, jpeg and the registries)
and ``video`` (h264, vp9); both build on this module, so neither imports
the other's definitions through a cycle.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .errors import FormatError


def _window_out(shape: tuple[int, ...], t0: int, t: int, out: np.ndarray | None) -> np.ndarray:
    if not (0 <= t0 and t >= 0 and t0 + t <= shape[0]):
        raise FormatError(f"frames {t0}:{t0 + t} fall outside a clip of {shape[0]} frames")
    want = (t, *shape[1:])
    if out is None:
        return np.empty(want, dtype=np.uint8)
    if out.shape != want or out.dtype != np.uint8:
        raise ValueError(f"out must be uint8 {want}, got {out.dtype} {out.shape}")
    return out


def _picks_out(shape: tuple[int, ...], picks: Sequence[int], out: np.ndarray, at: tuple[int, int]) -> list[int]:
    """``picks`` as a list, checked against a clip of ``shape`` and ``out`` (uint8 (len(picks), h, w, C) whose
    (h, w) from ``at`` lies inside the frame); FormatError for a frame outside the clip, ValueError for a bad
    ``out`` or ``at``."""
    js = [int(j) for j in picks]
    if js and not (0 <= min(js) and max(js) < shape[0]):
        raise FormatError(f"frame {max(js) if max(js) >= shape[0] else min(js)} falls outside a clip of "
                          f"{shape[0]} frames")
    y0, x0 = at
    if out.dtype != np.uint8 or out.ndim != 4 or out.shape[0] != len(js) or out.shape[3] != shape[3] \
            or not (0 <= y0 and 0 <= x0 and y0 + out.shape[1] <= shape[1] and x0 + out.shape[2] <= shape[2]):
        raise ValueError(f"out must be uint8 ({len(js)}, h, w, {shape[3]}) with its h x w at {at} inside frames "
                         f"of {shape[1]}x{shape[2]}, got {out.dtype} {out.shape}")
    return js


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
    ``"jpeg"`` (a baseline JPEG file, which carries its own size); or
    ``"stream"``, one bitstream coding all T frames as one closed group of
    pictures (``"h264"``: an Annex-B stream; ``"vp9"``: an IVF file), decoded
    from its start, frames of odd size coded padded to even.
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

    def crc_checked(self, asked: bool) -> bool:
        """Whether a reader checks the payload's CRC-32 before decoding it: when ``asked``, and always for a
        bitstream, which goes to FFmpeg's decoders (damaged input can crash or hang them), so they get only the
        bytes the converter wrote. The one rule every reader follows."""
        return asked or self.layout == "stream"


class ClipEncoder:
    """Encodes the clips of one video, in order: ``encode(clip)`` for each, then ``close()`` (or a ``with``).

    A codec that codes each clip on its own (raw, lz4, jpeg) keeps nothing
    between clips. A video codec keeps one encoder open for the whole video,
    since opening one costs as much as coding a few frames; each clip still
    starts with a keyframe and refers to nothing before it, so it decodes
    alone. A clip's bytes may then depend on the clips before it in its
    video, which is why a video is always encoded from its first clip (a
    rerun redoes whole videos) and the same video gives the same bytes.
    """

    def __init__(self, *, codec: Codec) -> None:
        self.codec = codec

    def encode(self, clip: np.ndarray) -> bytes | memoryview:
        """The payload of the video's next uint8 (T, H, W, C) clip."""
        return self.codec.encode(clip)

    def close(self) -> None:
        """Releases what the encoder holds; nothing is written after the last clip."""

    def __enter__(self) -> ClipEncoder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


LAYOUTS = ("array", "frames", "stream")
CODINGS = ("none", "lz4-block", "jpeg", "h264", "vp9")


class Codec:
    """What every payload codec offers; subclasses fill it in."""

    name: ClassVar[str] = ""
    id: ClassVar[int] = -1
    summary: ClassVar[str] = ""  # what it stores, in a few words (the command line's help)
    payload: ClassVar[Payload]
    # Raw bytes per stored byte a conversion can count on (at least): sizes the
    # free-space estimate before any video is encoded. 1.0 when nothing is known.
    expected_ratio: ClassVar[float] = 1.0
    # The codec's quality setting (``--quality``), on the codec's own scale; None: it has none.
    quality_range: ClassVar[tuple[int, int] | None] = None
    default_quality: ClassVar[int | None] = None
    # The default quality is recorded in the manifest even when not given (False for jpeg, whose conversions
    # predate the setting and so record it only when given).
    records_default_quality: ClassVar[bool] = False

    def __init__(self, quality: int | None = None) -> None:
        self.quality = self.check_quality(quality)

    @classmethod
    def check_quality(cls, quality: int | None) -> int | None:
        """``quality`` checked against the codec's scale (None: its default); ValueError in one line."""
        if quality is None:
            return cls.default_quality
        if cls.quality_range is None:
            raise ValueError(f"codec {cls.name} has no quality setting (got {quality!r})")
        low, high = cls.quality_range
        if isinstance(quality, bool) or not isinstance(quality, int) or not low <= quality <= high:
            raise ValueError(f"{cls.name} quality must be an integer in {low}..{high}, got {quality!r}")
        return quality

    @classmethod
    def recorded_quality(cls, quality: int | None) -> int | None:
        """What the manifest records for a conversion asked for ``quality`` (None: nothing)."""
        if quality is None and not cls.records_default_quality:
            return None
        return cls.check_quality(quality)

    def encode(self, clip: np.ndarray) -> bytes | memoryview:
        """The payload of one uint8 (T, H, W, C) clip."""
        raise NotImplementedError(f"codec {self.name} (id {self.id}) is read-only")

    def encoder(self) -> ClipEncoder:
        """An encoder for the clips of one video, given in order (``ClipEncoder``)."""
        return ClipEncoder(codec=self)

    def decode(self, payload: bytes | memoryview, shape: tuple[int, ...]) -> np.ndarray:
        """The whole clip as uint8 (T, H, W, C)."""
        return self.window(payload, shape, 0, shape[0])

    def window(self, payload: bytes | memoryview, shape: tuple[int, ...], t0: int, t: int,
               out: np.ndarray | None = None) -> np.ndarray:
        """Frames ``t0:t0+t`` as uint8 (t, H, W, C), written into ``out`` when given.

        Only the window's frames are decoded where the payload allows it.
        """
        raise NotImplementedError

    def frames_at(self, payload: bytes | memoryview, shape: tuple[int, ...], picks: Sequence[int],
                  out: np.ndarray, *, at: tuple[int, int] = (0, 0)) -> np.ndarray:
        """Frames ``picks`` of the clip (any order, repeats allowed) written into ``out``, uint8
        (len(picks), h, w, C): of each frame the h x w region whose top-left corner is ``at`` (row, column).

        What a reader assembling a sample from a video's stored clips asks of
        each clip (``ClipStore.frames``). Here: the frames from the first to
        the last picked are decoded (``window``); codecs that can decode only
        the frames picked override it.
        """
        js = _picks_out(shape, picks, out, at)
        if js:
            first = min(js)
            frames = self.window(payload, shape, first, max(js) - first + 1)
            y0, x0 = at
            h, w = out.shape[1:3]
            out[...] = frames[np.asarray(js) - first, y0:y0 + h, x0:x0 + w]
        return out

    def parts(self, payload: bytes | memoryview, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        """(offsets, sizes) int64: the byte ranges of ``payload`` coded separately, one per frame or one in all."""
        return np.zeros(1, np.int64), np.full(1, len(payload), np.int64)

    def check_framing(self, payload: bytes | memoryview, shape: tuple[int, ...], offsets: np.ndarray,
                      sizes: np.ndarray) -> None:
        """FormatError in one line when what the parts ``offsets``/``sizes`` of ``payload`` say of their own
        pictures (their size and count, read from their headers, nothing decoded) disagrees with a clip of
        ``shape``.

        What a reader asks before it hands a payload to a decoder that sizes
        its output by the pictures rather than by the clip header (DALI's image
        and video decoders), which would otherwise allocate whatever a forged
        payload says. Nothing to check here: this codec's decoding is sized by
        the header's shape.
        """

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
