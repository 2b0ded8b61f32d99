"""A video payload's own headers, read without decoding: what they say of the pictures' size and count.

The checks every reader makes before a video decoder sizes anything by the
stream (FORMAT.md, *Video payloads*): H.264 sequence parameter sets and
picture count, VP9 profile, superframes and stated frame sizes.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest

from convert.format import FormatError
from convert.format.bitstreams import (
    IVF_FRAME_HEADER,
    IVF_HEADER,
    check_h264,
    check_vp9,
    h264_sps_size,
    ivf_frame_spans,
    vp9_frame_size,
    vp9_superframe,
)
from convert.format.codecs import get_codec
from convert.format.video import coded_size

pytest.importorskip("av")


def _clip(t: int, h: int, w: int) -> np.ndarray:
    y, x = np.mgrid[0:h, 0:w]
    return np.stack([np.stack([(x + 3 * i) % 256, (y + i) % 256, (x + y) % 256], -1) for i in range(t)]).astype(
        np.uint8)


def _nals(stream: bytes) -> list[bytes]:
    return [n for n in stream.split(b"\x00\x00\x01") if n]


def _ivf_frames(payload: bytes, t: int) -> list[bytes]:
    view = memoryview(payload)
    return [bytes(view[at:at + n]) for at, n in ivf_frame_spans(view, t)]


def _ivf(frames: list[bytes], shape: tuple[int, ...]) -> bytes:
    height, width = coded_size(shape)
    out = [struct.pack("<4sHH4sHHIIII", b"DKIF", 0, IVF_HEADER, b"VP90", width, height, 25, 1, len(frames), 0)]
    for i, f in enumerate(frames):
        out += [struct.pack("<IQ", len(f), i), f]
    return b"".join(out)


@pytest.mark.parametrize("size", [(37, 51), (128, 171), (64, 64)])
def test_what_the_writer_codes_is_what_the_headers_say(size):
    shape = (4, *size, 3)
    h264 = bytes(get_codec("h264").encode(_clip(*shape[:3])))
    sets = [n for n in _nals(h264) if n[0] & 0x1F == 7]
    assert sets and all(h264_sps_size(n.rstrip(b"\x00")) == coded_size(shape) for n in sets)
    check_h264(h264, coded_size(shape), 4)
    vp9 = bytes(get_codec("vp9").encode(_clip(*shape[:3])))
    frames = _ivf_frames(vp9, 4)
    assert vp9_frame_size(frames[0]) == coded_size(shape) and not any(map(vp9_superframe, frames))
    check_vp9(frames, coded_size(shape))


def test_an_h264_stream_saying_another_size_or_count_is_refused_before_decoding():
    shape = (4, 32, 40, 3)
    small = bytes(get_codec("h264").encode(_clip(*shape[:3])))
    big = bytes(get_codec("h264").encode(_clip(4, 256, 320)))
    # A second sequence parameter set, of a larger size, after the first picture: every set is checked.
    start = b"\x00\x00\x00\x01"
    nals = _nals(small)
    big_sps = next(n for n in _nals(big) if n[0] & 0x1F == 7)
    pictures = [i for i, n in enumerate(nals) if n[0] & 0x1F in (1, 5)]
    spliced = start + start.join(nals[:pictures[0] + 1] + [big_sps] + nals[pictures[0] + 1:])
    with pytest.raises(FormatError, match="sequence parameter set codes 256x320 frames; the clip's are coded at 32x40"):
        check_h264(spliced, coded_size(shape), 4)
    with pytest.raises(FormatError, match="codes more than the 3 frames"):
        check_h264(small, coded_size(shape), 3)
    with pytest.raises(FormatError, match="holds 4 pictures, header says 5"):
        check_h264(small, coded_size(shape), 5)
    with pytest.raises(FormatError, match="no sequence parameter set"):
        check_h264(start + start.join(n for n in nals if n[0] & 0x1F != 7), coded_size(shape), 4)
    with pytest.raises(FormatError, match="does not start with an Annex-B start code"):
        check_h264(small[4:], coded_size(shape), 4)
    # A set cut short, and an Exp-Golomb code longer than the format's integers: damage, in one line.
    sps = next(n for n in nals if n[0] & 0x1F == 7)
    for bad, words in [(sps[:4], "cut short"), (sps[:4] + b"\x00" * 8 + b"\x80", "more than 32 bits")]:
        with pytest.raises(FormatError, match=words):
            h264_sps_size(bad)


def test_a_vp9_stream_saying_another_size_or_profile_is_refused_before_decoding():
    shape = (4, 32, 40, 3)
    frames = _ivf_frames(bytes(get_codec("vp9").encode(_clip(*shape[:3]))), 4)
    big = _ivf_frames(bytes(get_codec("vp9").encode(_clip(4, 256, 320))), 4)
    coded = coded_size(shape)
    # A key frame of another size in the middle of the clip (its inter frames take their size from a reference).
    assert [vp9_frame_size(f) for f in frames[1:]] == [None] * 3
    with pytest.raises(FormatError, match="frame 2 states 256x320; the clip's frames are coded at 32x40"):
        check_vp9(frames[:2] + big[:1] + frames[3:], coded)
    with pytest.raises(FormatError, match="frame 0 is not a key frame"):
        check_vp9(frames[1:], coded)
    profile1 = bytes([frames[0][0] | 0x20]) + frames[0][1:]  # the profile's low bit, after the frame marker
    with pytest.raises(FormatError, match=r"profile 1; the format allows profile 0 only \(frame 0\)"):
        check_vp9([profile1, *frames[1:]], coded)
    marker = 0xC0 | (1 << 3) | 1  # two frames, sizes in two bytes each
    superframe = frames[0] + frames[1] + bytes([marker]) + struct.pack("<HH", len(frames[0]), len(frames[1])) + \
        bytes([marker])
    assert vp9_superframe(superframe)
    with pytest.raises(FormatError, match="frame 0 is a superframe"):
        check_vp9([superframe], coded)
    with pytest.raises(FormatError, match="cut short"):
        check_vp9([frames[0][:3]], coded)
    with pytest.raises(FormatError, match="frame marker"):
        check_vp9([b"\x00" + frames[0][1:]], coded)
    # Through the codec: the IVF header may say the clip's size while the frames say another.
    forged = _ivf(big, shape)
    with pytest.raises(FormatError, match="frame 0 states 256x320"):
        get_codec("vp9").decode(forged, shape)
    assert len(forged) > IVF_HEADER + IVF_FRAME_HEADER
