"""Video-coded clip payloads: each clip one short H.264 or VP9 bitstream, decoded by FFmpeg (PyAV) here.

A clip's 16 frames are one shot, which an inter-frame codec compresses far
better than 16 separate JPEGs (docs/benchmarks.md). Each clip's bitstream is
one closed group of pictures: the first frame is a keyframe and no frame
refers outside the clip; a temporal window is decoded from the clip's start
and the frames before it dropped. A conversion keeps one encoder open for
the clips of a video (``VideoClipEncoder``), a keyframe forced at each
clip's start: opening an encoder costs as much as coding a few frames.

What the payload is (FORMAT.md, *Video payloads*), so that FFmpeg alone, or
DALI's video decoder, reads it from memory:

- ``h264``: an H.264 Annex-B byte stream (start codes, SPS and PPS in band
  before the IDR picture), no B-frames, so decoding order is display order
  and no decoder or demuxer has to reorder by timestamps.
- ``vp9``: an IVF file (32-byte header, then a 12-byte header per frame).

Pixels: frames of odd height or width are padded to even (their last row
and column repeated) for 4:2:0 chroma and cropped back after decoding. YUV
is BT.601 full range (the JPEG convention), written into each bitstream's
colour description; RGB is defined by libswscale's conversion with
``SWS_BILINEAR | SWS_ACCURATE_RND | SWS_FULL_CHR_H_INT``, which DALI's CPU
video decoder gives bit for bit (tested). The encoders run one thread with
fixed settings, so a rerun writes the same bytes.

PyAV is imported when a video payload is first encoded or decoded, never by
importing this module: reading raw, lz4 or jpeg conversions imports no PyAV.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Iterator, Sequence
from fractions import Fraction
from typing import TYPE_CHECKING, Any, ClassVar, cast

import numpy as np

from .bitstreams import IVF_HEADER, check_h264, check_vp9, ivf_frame_spans
from .errors import FormatError
from .payload import ClipEncoder, Codec, Payload, _picks_out, _window_out

if TYPE_CHECKING:
    import av

# BT.601 full range, as the bitstreams' colour description records it (AVColorSpace, AVColorRange values) and as
# libswscale's conversions name it.
_COLORSPACE_BT601 = 5  # AVCOL_SPC_BT470BG: the BT.601 matrix
_RANGE_FULL = 2  # AVCOL_RANGE_JPEG
# IVF's time base: one tick a frame (the clips' frame rate is the manifest's, not the payload's).
_TIME_BASE = Fraction(1, 25)


def _even(n: int) -> int:
    return n + (n & 1)


def coded_size(shape: tuple[int, ...]) -> tuple[int, int]:
    """(height, width) a clip of ``shape`` is coded at: each rounded up to even for 4:2:0 chroma."""
    return _even(shape[1]), _even(shape[2])


class _Swscale(threading.local):
    """One libswscale context per thread and direction: creating one per frame costs more than the conversion.

    Each converts in its caller's thread (``threads=1``): PyAV's default starts
    a pool of libswscale threads per context, which a process forked after a
    conversion (a DataLoader worker, ``verify``'s checker) inherits without
    its threads, so its next conversion waited for ever. One thread also
    keeps readers, one per reader thread already, from oversubscribing the
    cores; the pixels are the same.
    """

    def __init__(self) -> None:
        from av.video.reformatter import ColorRange, Colorspace, Interpolation, VideoReformatter

        self.bt601, self.full = int(Colorspace.ITU601), int(ColorRange.JPEG)
        self.to_yuv = VideoReformatter()
        self.to_rgb = VideoReformatter()
        # Encoding: area averaging of the chroma (the best PSNR of the filters tried); any deterministic choice
        # is allowed here, the decoding side is the one FORMAT.md fixes.
        self.encode_flags = int(Interpolation.AREA)
        self.decode_flags = int(Interpolation.BILINEAR) | int(Interpolation.ACCURATE_RND) | \
            int(Interpolation.FULL_CHR_H_INT)


_SWS: _Swscale | None = None


def _sws() -> _Swscale:
    global _SWS
    if _SWS is None:
        _SWS = _Swscale()
    return _SWS


def yuv_frames(clip: np.ndarray) -> list[av.VideoFrame]:
    """The clip's frames as BT.601 full-range YUV 4:2:0, padded to even size (last row/column repeated)."""
    import av

    _, h, w, _ = clip.shape
    height, width = coded_size(clip.shape)
    if (height, width) != (h, w):
        clip = np.pad(clip, ((0, 0), (0, height - h), (0, width - w), (0, 0)), mode="edge")
    sws = _sws()
    frames = []
    for i, rgb in enumerate(np.ascontiguousarray(clip, dtype=np.uint8)):
        yuv = sws.to_yuv.reformat(av.VideoFrame.from_ndarray(rgb, format="rgb24"), format="yuv420p",
                                  dst_colorspace=sws.bt601, dst_color_range=sws.full, interpolation=sws.encode_flags,
                                  threads=1)
        yuv.pts = i
        yuv.colorspace, yuv.color_range = _COLORSPACE_BT601, _RANGE_FULL
        frames.append(yuv)
    return frames


def _as_yuv420p(frame: av.VideoFrame) -> av.VideoFrame:
    """A yuvj420p frame's planes in a new yuv420p frame, copied plane to plane (rows cropped to the picture: the
    two frames' row strides differ), which costs less than a round trip through one contiguous array."""
    import av

    out = av.VideoFrame(frame.width, frame.height, "yuv420p")
    for dst, src in zip(out.planes, frame.planes):
        into = np.frombuffer(memoryview(dst), np.uint8).reshape(-1, dst.line_size)
        rows = np.frombuffer(memoryview(src), np.uint8).reshape(-1, src.line_size)
        into[:dst.height, :dst.width] = rows[:src.height, :src.width]
    return out


def rgb_into(frame: av.VideoFrame, out: np.ndarray, at: tuple[int, int] = (0, 0)) -> None:
    """A decoded frame as RGB (FORMAT.md's conversion), its ``out``-sized region whose top-left corner is ``at``
    written into ``out``."""

    if frame.format.name != "yuv420p":
        # H.264 decoders report full range as the deprecated "yuvj420p", which libswscale converts differently
        # from yuv420p with full range given; the same planes relabelled convert as FORMAT.md says.
        if frame.format.name != "yuvj420p":
            raise FormatError(f"decoded frame is {frame.format.name}, the format allows yuv420p only")
        frame = _as_yuv420p(frame)
    sws = _sws()
    rgb = sws.to_rgb.reformat(frame, format="rgb24", src_colorspace=sws.bt601, src_color_range=sws.full,
                              interpolation=sws.decode_flags, threads=1).to_ndarray()
    h, w = out.shape[:2]
    out[...] = rgb[at[0]:at[0] + h, at[1]:at[1] + w]


class VideoCodec(Codec):
    """A clip as one closed-GOP bitstream of an FFmpeg codec (subclasses: ``H264Codec``, ``Vp9Codec``).

    ``quality``: the encoder's constant-rate factor (lower is better and
    larger), within ``quality_range``; ``default_quality`` keeps the jpeg
    codec's fidelity at a fraction of its bytes (docs/benchmarks.md).
    """

    encoder_name: ClassVar[str]  # FFmpeg's encoder
    decoder_name: ClassVar[str]  # FFmpeg's decoder
    encoder_options: ClassVar[dict[str, str]]  # fixed settings besides the quality: part of what a rerun repeats
    records_default_quality = True

    # -- encoding ------------------------------------------------------------------------------------------------
    def _context(self, shape: tuple[int, ...]) -> av.VideoCodecContext:
        import av

        cc = cast("av.VideoCodecContext", av.CodecContext.create(self.encoder_name, "w"))
        cc.height, cc.width = coded_size(shape)
        cc.pix_fmt = "yuv420p"
        cc.time_base = _TIME_BASE
        cc.framerate = Fraction(1) / _TIME_BASE
        cc.colorspace, cc.color_range = _COLORSPACE_BT601, _RANGE_FULL
        # One thread: the bytes then depend on nothing but the frames and these settings (a conversion runs a
        # shard process per core already).
        cc.thread_count = 1
        cc.options = {**self.encoder_options, "crf": str(self.quality)}
        return cc

    def encoder(self) -> VideoClipEncoder:
        return VideoClipEncoder(codec=self)

    def packets(self, clip: np.ndarray) -> list[bytes]:
        """One clip's coded frames by a fresh encoder, one packet each, in decoding order (= display order)."""
        encoder = self.encoder()
        try:
            return encoder.packets(clip)
        finally:
            encoder.close()

    def encode(self, clip: np.ndarray) -> bytes:
        return self.pack(self.packets(clip), clip.shape)

    def pack(self, packets: list[bytes], shape: tuple[int, ...]) -> bytes:
        """The payload holding one clip's ``packets`` (the codec's stream form)."""
        raise NotImplementedError

    def _filter(self, packets: list[Any]) -> list[bytes]:
        return [bytes(p) for p in packets]

    # -- decoding ------------------------------------------------------------------------------------------------
    def coded_frames(self, payload: bytes | memoryview, cc: av.CodecContext,
                     shape: tuple[int, ...]) -> list[av.Packet]:
        """The payload of a clip of ``shape`` split into the packets decoder ``cc`` is fed (FormatError where it
        cannot be, or where the stream's own framing disagrees with the clip)."""
        raise NotImplementedError

    def pictures(self, payload: bytes | memoryview, shape: tuple[int, ...]) -> Iterator[av.VideoFrame]:
        """The payload's decoded pictures (YUV, coded size), in order, each checked against the clip's coded size
        and their count against its T: a damaged or foreign payload is a FormatError in one line."""
        import av

        # The stream's own headers first (nothing decoded): a stream that says it codes other pictures than the
        # clip's, or more of them, is refused before the decoder sizes anything by it.
        self.check_framing(payload, shape, *self.parts(payload, shape))
        cc = cast("av.VideoCodecContext", av.CodecContext.create(self.decoder_name, "r"))
        cc.thread_count = 1
        height, width = coded_size(shape)
        # A damaged bitstream is an error, not frames concealed from their neighbours. max_pixels: FFmpeg refuses
        # a picture larger than the clip's before allocating it, so a stream coded at a larger size than its
        # header says costs no more memory than the clip. Decoders check their block-aligned size (H.264's
        # macroblocks, VP9's superblocks): the bound is the clip's coded size rounded up to whole 64x64 blocks.
        cc.options = {"err_detect": "crccheck+bitstream+buffer+explode",
                      "max_pixels": str(-(-height // 64) * 64 * -(-width // 64) * 64)}
        n = 0
        try:
            packets: list[av.Packet | None] = [*self.coded_frames(payload, cc, shape), None]
            for packet in packets:
                for frame in cc.decode(packet):  # None flushes
                    if (frame.height, frame.width) != (height, width):
                        raise FormatError(f"{self.name} frame {n} is {frame.height}x{frame.width}, the clip's "
                                          f"{shape[1]}x{shape[2]} is coded at {height}x{width}")
                    if n == shape[0]:  # one frame past the clip: stop here, whatever else the stream holds
                        raise FormatError(f"{self.name} payload decodes to more than the {shape[0]} frames its "
                                          f"header says")
                    yield frame
                    n += 1
        except av.FFmpegError as exc:
            raise FormatError(f"{self.name} payload does not decode (frame {n}): {exc}") from exc
        if n != shape[0]:
            raise FormatError(f"{self.name} payload decodes to {n} frames, header says {shape[0]}")

    def window(self, payload: bytes | memoryview, shape: tuple[int, ...], t0: int, t: int,
               out: np.ndarray | None = None) -> np.ndarray:
        import av

        out = _window_out(shape, t0, t, out)
        for n, frame in enumerate(self.pictures(payload, shape)):
            if t0 <= n < t0 + t:
                try:
                    rgb_into(frame, out[n - t0])
                except av.FFmpegError as exc:  # libswscale's, said as pictures() says the decoder's
                    raise FormatError(f"{self.name} payload does not decode (frame {n}): {exc}") from exc
        return out

    def frames_at(self, payload: bytes | memoryview, shape: tuple[int, ...], picks: Sequence[int],
                  out: np.ndarray, *, at: tuple[int, int] = (0, 0)) -> np.ndarray:
        # Decoded from the start (a closed GOP) up to the last frame picked, and no further; only the frames
        # picked are converted to RGB, and only their region of it kept.
        import av

        js = _picks_out(shape, picks, out, at)
        if not js:
            return out
        rows: dict[int, list[int]] = {}
        for k, j in enumerate(js):
            rows.setdefault(j, []).append(k)
        last = max(js)
        for n, frame in enumerate(self.pictures(payload, shape)):
            if n in rows:
                first, *rest = rows[n]
                try:
                    rgb_into(frame, out[first], at)
                except av.FFmpegError as exc:  # libswscale's, said as pictures() says the decoder's
                    raise FormatError(f"{self.name} payload does not decode (frame {n}): {exc}") from exc
                for k in rest:
                    out[k] = out[first]
            if n == last:
                break
        return out


class VideoClipEncoder(ClipEncoder):
    """One FFmpeg encoder kept open across a video's clips, a keyframe forced at each clip's first frame.

    The settings of each codec give one packet per frame at once (no
    B-frames, no look-ahead), so each clip's packets are complete when its
    last frame goes in, and the encoder is never flushed between clips. A
    keyframe (H.264: an IDR picture with the SPS and PPS before it; VP9: a
    key frame, which resets every reference and probability context) makes
    the clip's stream independent of the clips before it.
    """

    codec: VideoCodec

    def __init__(self, *, codec: VideoCodec) -> None:
        super().__init__(codec=codec)
        self._cc: av.VideoCodecContext | None = None
        self._shape: tuple[int, ...] = ()
        self._pts = 0

    def packets(self, clip: np.ndarray) -> list[bytes]:
        """The clip's coded frames, one packet each, in decoding order (= display order)."""
        from av.video.frame import PictureType

        clip = np.asarray(clip)
        codec = self.codec
        if clip.ndim != 4 or clip.shape[3] != 3 or clip.dtype != np.uint8 or clip.shape[0] < 1:
            raise ValueError(f"{codec.name} encodes uint8 (T, H, W, 3) clips, got {clip.dtype} {clip.shape}")
        if self._cc is None or clip.shape[1:] != self._shape:
            self.close()  # a clip of another size (not one a conversion makes) starts a new encoder
            self._cc, self._shape, self._pts = codec._context(clip.shape), clip.shape[1:], 0
        out: list[Any] = []
        for i, frame in enumerate(yuv_frames(clip)):
            frame.pts, self._pts = self._pts, self._pts + 1
            frame.pict_type = PictureType.I if i == 0 else PictureType.NONE
            out += self._cc.encode(frame)
        if len(out) != clip.shape[0] or not out[0].is_keyframe:
            raise FormatError(f"{codec.encoder_name} gave {len(out)} packets for a clip of {clip.shape[0]} frames"
                              f"{'' if out and out[0].is_keyframe else ', not starting with a keyframe'}")
        return codec._filter(out)

    def encode(self, clip: np.ndarray) -> bytes:
        return self.codec.pack(self.packets(clip), clip.shape)

    def close(self) -> None:
        # Dropped unflushed: every frame given has come out already (packets()).
        self._cc = None


class H264Codec(VideoCodec):
    """H.264 (libx264), one Annex-B stream per clip without B-frames: NVDEC decodes it on the GPU."""

    name, id = "h264", 4
    summary = "an H.264 stream per clip, lossy, decoded by NVDEC under DALI (GPU only there)"
    payload = Payload(layout="stream", coding="h264", lossless=False)
    expected_ratio = 30.0
    encoder_name, decoder_name = "libx264", "h264"
    quality_range, default_quality = (0, 51), 16
    # veryfast: nearly medium's bytes at a fraction of its time at these sizes; bf=0: no reordering (module doc).
    # mbtree=0: with x264's macroblock-tree rate control on, one thread and the same frames still gave other
    # bytes now and then in a shard process (a rerun must write the same bytes); without it, never in the
    # runs tried (docs/benchmarks.md has its cost in bytes, which a higher default CRF takes back).
    # partitions=none: no sub-macroblock partitions to search, a good part of the encoder's time for few bytes.
    # force-cfr: each frame comes out as it goes in (without it x264 holds one back to time it); forced-idr: the
    # keyframe forced at a clip's start is an IDR picture (VideoClipEncoder).
    encoder_options: ClassVar[dict[str, str]] = {"preset": "veryfast", "bf": "0", "g": "9999",
                                                 "sc_threshold": "0", "forced-idr": "1",
                                                 "x264-params": "mbtree=0:partitions=none:force-cfr=1"}

    def _filter(self, packets: list[Any]) -> list[bytes]:
        # x264 writes its version and settings into an SEI message on the first frame: bytes that say nothing
        # about the pixels and would tie the payload to the encoder's build. SEI NAL units (type 6) are dropped.
        import av

        bsf = av.bitstream.BitStreamFilterContext("filter_units=remove_types=6", "h264")
        out = [bytes(q) for p in packets for q in bsf.filter(p)]
        return out + [bytes(q) for q in bsf.filter(None)]

    def check_framing(self, payload: bytes | memoryview, shape: tuple[int, ...], offsets: np.ndarray,
                      sizes: np.ndarray) -> None:
        # One part, the whole stream: its sequence parameter sets say the pictures' size, its slices their count.
        check_h264(bytes(payload), coded_size(shape), shape[0])

    def coded_frames(self, payload: bytes | memoryview, cc: av.CodecContext,
                     shape: tuple[int, ...]) -> list[av.Packet]:
        # FFmpeg's H.264 parser cuts the Annex-B stream into access units, as a raw .h264 file is read.
        return [*cc.parse(bytes(payload)), *cc.parse(None)]

    def pack(self, packets: list[bytes], shape: tuple[int, ...]) -> bytes:
        return b"".join(packets)


class Vp9Codec(VideoCodec):
    """VP9 (libvpx), one IVF file per clip: decoded by NVDEC on the GPU and by DALI's CPU backend too."""

    name, id = "vp9", 5
    summary = "a VP9 stream (IVF) per clip, lossy, decoded by DALI on the GPU or the CPU"
    payload = Payload(layout="stream", coding="vp9", lossless=False)
    expected_ratio = 30.0
    encoder_name, decoder_name = "libvpx-vp9", "vp9"
    quality_range, default_quality = (0, 63), 20
    # realtime with cpu-used 8: libvpx's fastest mode, within a few per cent of its slower modes' bytes here.
    # lag-in-frames=0: each frame comes out as it goes in (VideoClipEncoder).
    encoder_options: ClassVar[dict[str, str]] = {"b:v": "0", "deadline": "realtime", "cpu-used": "8",
                                                 "g": "9999", "lag-in-frames": "0", "row-mt": "0"}

    def check_framing(self, payload: bytes | memoryview, shape: tuple[int, ...], offsets: np.ndarray,
                      sizes: np.ndarray) -> None:
        # One part, the whole stream: its IVF header says its length, size and frame count, each VP9 frame's
        # header its size.
        view = memoryview(payload)
        self._check_ivf(view, shape)
        check_vp9([view[at:at + n] for at, n in ivf_frame_spans(view, shape[0])], coded_size(shape))

    @staticmethod
    def _check_ivf(view: memoryview, shape: tuple[int, ...]) -> None:
        """FormatError unless the IVF header's fields are those pack() writes for a clip of ``shape``: its length,
        the coded size and the frame count."""
        if len(view) < IVF_HEADER or bytes(view[:4]) != b"DKIF" or bytes(view[8:12]) != b"VP90":
            raise FormatError(f"vp9 payload of {len(view)} bytes is not an IVF file of VP9 frames")
        (header_len,), (width, height, _, _, count) = struct.unpack_from("<H", view, 6), \
            struct.unpack_from("<HHIII", view, 12)
        if header_len != IVF_HEADER or (height, width) != coded_size(shape) or count != shape[0]:
            raise FormatError(f"vp9 payload: IVF header says {count} frames of {width}x{height} in a "
                              f"{header_len}-byte header; the clip's {shape[0]} frames of {shape[2]}x{shape[1]} "
                              f"are coded at {coded_size(shape)[1]}x{coded_size(shape)[0]} after {IVF_HEADER}")

    def pack(self, packets: list[bytes], shape: tuple[int, ...]) -> bytes:
        height, width = coded_size(shape)
        parts = [struct.pack("<4sHH4sHHIIII", b"DKIF", 0, IVF_HEADER, b"VP90", width, height,
                             _TIME_BASE.denominator, _TIME_BASE.numerator, len(packets), 0)]
        for pts, packet in enumerate(packets):
            parts += [struct.pack("<IQ", len(packet), pts), packet]
        return b"".join(parts)

    def coded_frames(self, payload: bytes | memoryview, cc: av.CodecContext,
                     shape: tuple[int, ...]) -> list[av.Packet]:
        import av

        view = memoryview(payload)
        self._check_ivf(view, shape)
        return [av.Packet(bytes(view[at:at + n])) for at, n in ivf_frame_spans(view, shape[0])]


__all__ = ["H264Codec", "VideoClipEncoder", "VideoCodec", "Vp9Codec", "coded_size", "rgb_into", "yuv_frames"]
