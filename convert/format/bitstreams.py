"""What a video payload's own headers say of its pictures, read without decoding: sizes and counts.

A video decoder (FFmpeg's, DALI's, NVDEC) sizes its pictures by what the
stream says, not by the clip header. A reader that hands a payload to one
of them first reads, here, the few header fields that decide what the
decoder allocates: H.264's sequence parameter sets and the count of its
pictures, VP9's frame sizes. A stream that says anything else than what the
clip header allows is refused (``FormatError``) before a picture of it is
allocated. Pure Python over bytes: no PyAV, no decoder.

What FORMAT.md (*Video payloads*) allows, and these checks hold:

- h264: every sequence parameter set codes 8-bit 4:2:0 progressive frames of
  exactly the clip's coded size (in whole macroblocks, cropped back by the
  set's frame cropping), and the stream holds exactly T pictures.
- vp9: profile 0; each IVF frame one VP9 frame (no superframe index); every
  frame that states its size states the clip's coded size (the others take a
  reference's, which was stated so).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from .errors import FormatError

# H.264 NAL unit types (ITU-T H.264 table 7-1) the checks look at.
_NAL_SLICE, _NAL_IDR, _NAL_SPS = 1, 5, 7
# Profiles whose sequence parameter sets carry the chroma format and bit depths (H.264 7.3.2.1.1).
_HIGH_PROFILES = frozenset({100, 110, 122, 244, 44, 83, 86, 118, 128, 138, 139, 134, 135})
# A VP9 frame whose last byte is of this form (with its top three bits 110) may end in a superframe index.
_VP9_SUPERFRAME = 0xC0
_VP9_SYNC = 0x498342
# IVF's file header and per-frame header, in bytes.
IVF_HEADER, IVF_FRAME_HEADER = 32, 12


class _Bits:
    """A big-endian bit reader over bytes; reading past the end is a FormatError naming ``what``."""

    def __init__(self, data: bytes, what: str) -> None:
        self.value, self.size, self.pos, self.what = int.from_bytes(data, "big"), 8 * len(data), 0, what

    def u(self, n: int) -> int:
        """The next ``n`` bits as an unsigned integer."""
        if self.pos + n > self.size:
            raise FormatError(f"{self.what} is cut short")
        self.pos += n
        return (self.value >> (self.size - self.pos)) & ((1 << n) - 1)

    def ue(self) -> int:
        """The next Exp-Golomb coded unsigned integer (H.264 9.1); more than 31 leading zeros is damage."""
        zeros = 0
        while self.u(1) == 0:
            zeros += 1
            if zeros > 31:
                raise FormatError(f"{self.what} holds an Exp-Golomb code of more than 32 bits")
        return (1 << zeros) - 1 + self.u(zeros)

    def se(self) -> int:
        """The next signed Exp-Golomb coded integer."""
        k = self.ue()
        return (k + 1) // 2 if k & 1 else -(k // 2)


def _nal_units(data: bytes) -> list[tuple[int, int]]:
    """(start, end) of each NAL unit of an Annex-B byte stream (without its start code), in order; nothing is
    copied (a stream is read for a handful of header bytes)."""
    units, pos = [], data.find(b"\x00\x00\x01")
    while pos >= 0:
        start = pos + 3
        pos = data.find(b"\x00\x00\x01", start)
        # A four-byte start code's leading zero belongs to no NAL unit.
        end = len(data) if pos < 0 else pos - (data[pos - 1] == 0)
        units.append((start, end))
    return units


def _rbsp(nal: bytes) -> bytes:
    """A NAL unit's payload without its header byte and its emulation-prevention bytes (00 00 03 -> 00 00)."""
    return nal[1:].replace(b"\x00\x00\x03", b"\x00\x00")


def _skip_scaling_list(bits: _Bits, size: int) -> None:
    last = nxt = 8
    for _ in range(size):
        if nxt:
            nxt = (last + bits.se()) % 256
        last = nxt or last


def h264_sps_size(nal: bytes) -> tuple[int, int]:
    """(height, width) of the frames an H.264 sequence parameter set (a whole NAL unit) codes, after its frame
    cropping; FormatError where it codes anything but 8-bit 4:2:0 progressive frames."""
    bits = _Bits(_rbsp(nal), "h264 sequence parameter set")
    profile = bits.u(8)
    bits.u(16)  # constraint flags and level
    bits.ue()  # seq_parameter_set_id
    chroma, depth = 1, 0
    if profile in _HIGH_PROFILES:
        chroma = bits.ue()
        if chroma == 3:
            bits.u(1)  # separate_colour_plane_flag
        depth = max(bits.ue(), bits.ue())  # luma and chroma bit depths, minus 8
        bits.u(1)  # qpprime_y_zero_transform_bypass_flag
        if bits.u(1):  # seq_scaling_matrix_present_flag
            for i in range(8 if chroma != 3 else 12):
                if bits.u(1):
                    _skip_scaling_list(bits, 16 if i < 6 else 64)
    if (chroma, depth) != (1, 0):
        raise FormatError(f"h264 sequence parameter set codes chroma format {chroma} at {8 + depth} bits; the "
                          f"format allows 8-bit 4:2:0 only")
    bits.ue()  # log2_max_frame_num_minus4
    poc_type = bits.ue()
    if poc_type == 0:
        bits.ue()
    elif poc_type == 1:
        bits.u(1)
        bits.se()
        bits.se()
        for _ in range(bits.ue()):
            bits.se()
    bits.ue()  # max_num_ref_frames
    bits.u(1)  # gaps_in_frame_num_value_allowed_flag
    width_mbs, height_units = bits.ue() + 1, bits.ue() + 1
    if not bits.u(1):  # frame_mbs_only_flag
        raise FormatError("h264 sequence parameter set codes interlaced fields; the format allows progressive "
                          "frames only")
    bits.u(1)  # direct_8x8_inference_flag
    left = right = top = bottom = 0
    if bits.u(1):  # frame_cropping_flag: offsets in units of 2 luma samples each way for 4:2:0 frames
        left, right, top, bottom = bits.ue(), bits.ue(), bits.ue(), bits.ue()
    return 16 * height_units - 2 * (top + bottom), 16 * width_mbs - 2 * (left + right)


def check_h264(data: bytes, coded: tuple[int, int], frames: int) -> None:
    """FormatError in one line unless Annex-B stream ``data`` codes exactly ``frames`` pictures and every one of
    its sequence parameter sets codes frames of ``coded`` (height, width)."""
    if not (data.startswith(b"\x00\x00\x00\x01") or data.startswith(b"\x00\x00\x01")):
        raise FormatError(f"h264 payload of {len(data)} bytes does not start with an Annex-B start code")
    pictures = sets = 0
    for start, end in _nal_units(data):
        kind = data[start] & 0x1F if end > start else 0
        if kind == _NAL_SPS:
            size = h264_sps_size(data[start:end])
            if size != coded:
                raise FormatError(f"h264 sequence parameter set codes {size[0]}x{size[1]} frames; the clip's are "
                                  f"coded at {coded[0]}x{coded[1]}")
            sets += 1
        elif kind in (_NAL_SLICE, _NAL_IDR) and end > start + 1 and data[start + 1] & 0x80:
            # A slice whose first_mb_in_slice is 0 (Exp-Golomb "1": the first bit set) starts a picture.
            pictures += 1
            if pictures > frames:
                raise FormatError(f"h264 payload codes more than the {frames} frames its header says")
    if not sets:
        raise FormatError("h264 payload holds no sequence parameter set")
    if pictures != frames:
        raise FormatError(f"h264 payload holds {pictures} pictures, header says {frames}")


def vp9_frame_size(frame: bytes | memoryview) -> tuple[int, int] | None:
    """(height, width) a VP9 frame's uncompressed header states, or None where it takes a reference frame's
    size (or shows one already decoded); FormatError where it is not a profile-0 frame."""
    # The fields read here lie in a profile-0 header's first 10 bytes; the rest of the frame is not copied.
    bits = _Bits(bytes(frame[:16]), "vp9 frame header")
    if bits.u(2) != 2:
        raise FormatError("vp9 frame does not start with the frame marker")
    profile = bits.u(1) | bits.u(1) << 1
    if profile != 0:
        raise FormatError(f"vp9 frame is of profile {profile}; the format allows profile 0 only")
    if bits.u(1):  # show_existing_frame: no new picture
        return None
    key, _show, resilient = bits.u(1) == 0, bits.u(1), bits.u(1)
    intra_only = False
    if not key:
        intra_only = bool(bits.u(1)) if not _show else False
        if not resilient:
            bits.u(2)  # reset_frame_context
    if key or intra_only:
        if bits.u(24) != _VP9_SYNC:
            raise FormatError("vp9 frame's sync code is wrong")
        if key and bits.u(3) != 7:  # color_space; profile 0's colour config is the colour space and range only
            bits.u(1)
        if intra_only:
            bits.u(8)  # refresh_frame_flags
    else:
        bits.u(8 + 3 * 4)  # refresh_frame_flags, then each reference's index and sign bias
        for _ in range(3):
            if bits.u(1):  # found_ref: the size is that reference's
                return None
    width, height = bits.u(16) + 1, bits.u(16) + 1
    return height, width


def vp9_superframe(frame: bytes | memoryview) -> bool:
    """Whether VP9 frame data ends in a superframe index (several frames in one)."""
    if not frame or frame[-1] & 0xE0 != _VP9_SUPERFRAME:
        return False
    marker = frame[-1]
    frames, size_bytes = (marker & 7) + 1, ((marker >> 3) & 3) + 1
    index = 2 + size_bytes * frames
    return len(frame) >= index and frame[-index] == marker


def check_vp9(frames: Sequence[bytes | memoryview], coded: tuple[int, int]) -> None:
    """FormatError in one line unless each of the VP9 frames (each an IVF frame's data) is one profile-0 frame
    whose stated size, where it states one, is ``coded`` (height, width)."""
    for n, frame in enumerate(frames):
        if vp9_superframe(frame):
            raise FormatError(f"vp9 payload: frame {n} is a superframe; the format allows one VP9 frame per IVF "
                              f"frame")
        try:
            size = vp9_frame_size(frame)
        except FormatError as exc:
            raise FormatError(f"vp9 payload: {exc} (frame {n})") from None
        if n == 0 and size is None:
            raise FormatError("vp9 payload: frame 0 is not a key frame")
        if size is not None and size != coded:
            raise FormatError(f"vp9 payload: frame {n} states {size[0]}x{size[1]}; the clip's frames are coded at "
                              f"{coded[0]}x{coded[1]}")


def ivf_frame_spans(view: memoryview, frames: int) -> list[tuple[int, int]]:
    """(offset, size) of each frame's data in IVF file ``view`` (header already checked), at most ``frames`` of
    them: FormatError where the frames are cut short or go on past ``frames``."""
    pos, spans = IVF_HEADER, list[tuple[int, int]]()
    while pos < len(view):
        if len(spans) == frames:
            raise FormatError(f"vp9 payload: IVF frames go on past the clip's {frames} at byte {pos}")
        if pos + IVF_FRAME_HEADER > len(view):
            raise FormatError(f"vp9 payload: IVF frame {len(spans)} header cut short at byte {pos}")
        (size,) = struct.unpack_from("<I", view, pos)
        pos += IVF_FRAME_HEADER
        if pos + size > len(view):
            raise FormatError(f"vp9 payload: IVF frame {len(spans)} of {size} bytes runs past the end")
        spans.append((pos, size))
        pos += size
    return spans


__all__ = ["IVF_FRAME_HEADER", "IVF_HEADER", "check_h264", "check_vp9", "h264_sps_size", "ivf_frame_spans",
           "vp9_frame_size", "vp9_superframe"]
