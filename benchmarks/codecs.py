"""``python -m benchmarks.codecs``: every clip codec's bytes, fidelity and CPU decoding speed, side by side.

The clips are what a real conversion stores: the real test videos (every
one but the corrupted file) converted with ``--codec raw`` by ``run_job``
into a scratch folder and read back through ``open_clips``. Each clip is
then encoded with every codec and quality listed in ``PROJECT_ROWS``, a
video's clips through one encoder as in a conversion; for
each row the first table gives the payload bytes per clip, the PSNR of the
decoded clip against the raw one (mean and minimum over the clips; one PSNR
per clip, over all its frames and channels) and the CPU milliseconds per
frame of encoding on one thread. HEVC (libx265) and AV1 (SVT-AV1, decoded
by dav1d) are not project codecs: ``OTHER_ROWS`` encode them through PyAV
the same way as the video codecs (one closed-GOP stream per clip, one
thread, the same YUV conversion) to say whether they would pay.

The second table times ``codec.decode`` on the CPU over every clip, on one
thread and on two (a thread pool decoding different clips, as the reader
threads do), in interleaved rounds (the best of each is kept); the
two-thread/one-thread ratio says whether decoding releases the GIL. The raw
codec's decode is a zero-copy view of the payload: its rate is the bound.
Then each codec's bytes per clip projected to Kinetics' training sets. Last,
the video codecs' encoding with one encoder per video, as a conversion
runs it, against a fresh encoder per clip, in interleaved rounds.

Run it from the repository root; docs/benchmarks.md records its tables.
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import shutil
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from benchmarks import scratch_folder
from benchmarks.conversion import DEFAULT_SHARED, build_tree
from convert.format import Codec, get_codec
from convert.format.codecs import _pack_parts, _table
from convert.format.payload import ClipEncoder
from convert.format.system import cpu_count
from convert.format.video import VideoCodec, yuv_frames
from convert.job.run import JobOptions, run_job
from convert.store import open_clips
from convert.worker import forkserver
from convert.worker.plan import ConvertConfig

if TYPE_CHECKING:
    import av

VIDEO_EXTENSIONS = (".mp4", ".avi", ".webm", ".mov", ".mkv")
SKIP = "corrupted"  # the shared folder's damaged file: its clips are not footage
# (codec name, quality): the project's codecs, each at its default (None) and the video codecs at other qualities.
PROJECT_ROWS: list[tuple[str, int | None]] = [("raw", None), ("lz4", None), ("jpeg", None),
                                              ("h264", 12), ("h264", None), ("h264", 18),
                                              ("vp9", 16), ("vp9", None), ("vp9", 28)]
# Kinetics' training sets (videos) and the clips a 10 s video gives at the default conversion (16 frames, no
# overlap): 250 frames at 25 fps make 15 clips, 300 at 30 fps 18.
KINETICS_TRAIN = {"Kinetics-400": 240_000, "Kinetics-700": 545_000}
CLIPS_PER_VIDEO = (15, 18)
MIN_SECONDS = 0.25  # the least time one decoding measurement takes (on one thread)


class _FreshEncoderPerClip(VideoCodec):
    """x265 and SVT-AV1 hold frames back (look-ahead), which a ``VideoClipEncoder`` refuses: each clip is coded by
    a fresh encoder, flushed at its end (their encode times so include opening an encoder per clip)."""

    def encoder(self) -> ClipEncoder:  # type: ignore[override]  # the plain one: encode() per clip
        return ClipEncoder(codec=self)

    def packets(self, clip: np.ndarray) -> list[bytes]:
        cc = self._context(clip.shape)
        out: list[Any] = []
        for frame in yuv_frames(clip):
            out += cc.encode(frame)
        return self._filter(out + cc.encode(None))


class HevcCodec(_FreshEncoderPerClip):
    """HEVC (libx265, preset veryfast, no B-frames), one Annex-B stream per clip: measured here, not a format codec."""

    name = "hevc"
    encoder_name, decoder_name = "libx265", "hevc"
    quality_range, default_quality = (0, 51), 18
    encoder_options: ClassVar[dict[str, str]] = {
        "preset": "veryfast",
        "x265-params": "bframes=0:keyint=9999:min-keyint=9999:scenecut=0:pools=none:frame-threads=1:log-level=error"}

    def _filter(self, packets: list[Any]) -> list[bytes]:
        # As the h264 codec: the encoder's version and settings (SEI NAL units, prefix 39 and suffix 40) dropped.
        import av

        bsf = av.bitstream.BitStreamFilterContext("filter_units=remove_types=39|40", "hevc")
        out = [bytes(q) for p in packets for q in bsf.filter(p)]
        return out + [bytes(q) for q in bsf.filter(None)]

    def pack(self, packets: list[bytes], shape: tuple[int, ...]) -> bytes:
        return b"".join(packets)

    def coded_frames(self, payload: bytes | memoryview, cc: av.CodecContext,
                     shape: tuple[int, ...]) -> list[av.Packet]:
        return [*cc.parse(bytes(payload)), *cc.parse(None)]


class Av1Codec(_FreshEncoderPerClip):
    """AV1 (SVT-AV1, one thread), its frames in a frame table (within 200 bytes of an IVF file), read by dav1d."""

    name = "av1"
    encoder_name, decoder_name = "libsvtav1", "libdav1d"
    quality_range, default_quality = (0, 63), 30
    # preset 10 of SVT-AV1's 0 (slowest) .. 13 (fastest); pred-struct 1: low delay, no reordering.
    encoder_options: ClassVar[dict[str, str]] = {"preset": "10", "g": "9999",
                                                 "svtav1-params": "lp=1:pred-struct=1:scd=0"}

    def pack(self, packets: list[bytes], shape: tuple[int, ...]) -> bytes:
        return _pack_parts(packets)

    def coded_frames(self, payload: bytes | memoryview, cc: av.CodecContext,
                     shape: tuple[int, ...]) -> list[av.Packet]:
        import av

        view = memoryview(payload)
        count = int.from_bytes(bytes(view[:4]), "little")  # the table's part count, checked against itself
        offsets, sizes = _table(view, (count,), self.name)
        return [av.Packet(bytes(view[o:o + n])) for o, n in zip(offsets.tolist(), sizes.tolist())]


# Not project codecs: (class, quality) rows measured beside them.
OTHER_ROWS: list[tuple[type[VideoCodec], int]] = [(HevcCodec, 18), (HevcCodec, 22), (Av1Codec, 30), (Av1Codec, 38)]


@dataclass
class Row:
    """One codec at one quality: its payloads of every clip and what they measured."""

    label: str
    codec: Codec
    payloads: list[bytes]
    psnr: list[float]
    encode_cpu_s: float


def row_label(codec: Codec) -> str:
    """A table's name for ``codec`` at its quality: "raw", "jpeg q90", "h264 CRF 14 (default)"."""
    if codec.quality is None:
        return codec.name
    scale = "q" if codec.name == "jpeg" else "CRF "
    default = " (default)" if codec.quality == codec.default_quality and codec.name in ("h264", "vp9") else ""
    return f"{codec.name} {scale}{codec.quality}{default}"


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """PSNR in dB of ``b`` against ``a`` (uint8, over every value); inf where they are equal."""
    mse = float(np.mean((a.astype(np.int32) - b.astype(np.int32)) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(255 ** 2 / mse)


def video_names(shared: str) -> list[str]:
    """The videos of ``shared`` a benchmark reads: every video file but the corrupted one."""
    return sorted(n for n in os.listdir(shared) if n.endswith(VIDEO_EXTENSIONS) and SKIP not in n)


def raw_clips(shared: str, scratch: str, *, names: Sequence[str] | None = None, max_clips: int | None = None,
              workers: int = 1) -> list[tuple[str, np.ndarray]]:
    """(video id, clip) of every clip a default raw conversion of the videos ``names`` of ``shared`` stores, read
    back from its shards in store order (a video's clips together, in order)."""
    names = list(names) if names else video_names(shared)
    tree, out = os.path.join(scratch, "videos"), os.path.join(scratch, "raw")
    shutil.rmtree(tree, ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)
    build_tree(tree, shared, len(names), names)
    try:
        run_job(tree, out, ConvertConfig(codec="raw", max_clips=max_clips), JobOptions(workers=workers, progress=False))
    finally:
        forkserver.stop()
    store = open_clips(out)
    try:
        return [(sample.video_id, np.array(sample.clip)) for sample in store]
    finally:
        store.close()


def measure_row(codec: Codec, clips: list[np.ndarray], videos: list[str]) -> Row:
    """Encode every clip with ``codec`` (timed on this thread's CPU clock), decode it back, compare.

    As a conversion does, the clips of a video (``videos[i]`` is clip i's)
    go through one ``codec.encoder()``, opened and closed within the timing.
    """
    payloads, scores, cpu = [], [], 0.0
    for _, group in itertools.groupby(zip(videos, clips), key=lambda pair: pair[0]):
        video = [clip for _, clip in group]
        t0 = time.thread_time()
        with codec.encoder() as encoder:
            coded = [bytes(encoder.encode(clip)) for clip in video]
        cpu += time.thread_time() - t0
        payloads += coded
        scores += [psnr(clip, codec.decode(payload, clip.shape)) for clip, payload in zip(video, coded)]
    return Row(row_label(codec), codec, payloads, scores, cpu)


def decode_rate(codec: Codec, payloads: list[bytes], shape: tuple[int, ...], threads: int, into: bool) -> float:
    """Clips/s of decoding every payload, shared out among ``threads`` threads (each its own share, as the
    reader threads have): by ``codec.decode`` (a new array each clip), or with ``into`` by ``codec.window``
    into one array of the thread's own, as a reader thread decodes into its batch."""
    def work(share: list[bytes]) -> None:
        out = np.empty(shape, np.uint8)
        for payload in share:
            if into:
                codec.window(payload, shape, 0, shape[0], out)
            else:
                codec.decode(payload, shape)

    t0 = time.perf_counter()
    if threads == 1:
        work(payloads)
    else:
        with ThreadPoolExecutor(threads) as pool:
            for done in [pool.submit(work, payloads[k::threads]) for k in range(threads)]:
                done.result()
    return len(payloads) / (time.perf_counter() - t0)


# The decoding ways timed: (into a buffer of the thread's own, threads), in this order in each round.
Ways = list[tuple[bool, int]]


def decode_rates(rows: list[Row], shape: tuple[int, ...], threads: int, rounds: int) -> dict[str, list[float]]:
    """Best clips/s of each row decoded each way of ``ways(threads)``, over interleaved rounds."""
    best: dict[str, list[float]] = {r.label: [0.0] * len(ways(threads)) for r in rows}
    # Each timing decodes the clips as many times over as last about MIN_SECONDS on one thread (a cheap codec's
    # single pass would time the thread pool's start), measured by a first, untimed pass (which also warms up).
    work = {r.label: r.payloads * math.ceil(MIN_SECONDS * decode_rate(r.codec, r.payloads, shape, 1, True)
                                            / len(r.payloads)) for r in rows}
    for _ in range(rounds):
        for r in rows:
            for k, (into, n) in enumerate(ways(threads)):
                best[r.label][k] = max(best[r.label][k], decode_rate(r.codec, work[r.label], shape, n, into))
    return best


def ways(threads: int) -> Ways:
    """The decoding ways, in the decoding table's column order."""
    return [(False, 1), (False, threads), (True, 1), (True, threads)]


def _size(nbytes: float) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes / 1e3:.1f} KB"


def projected(bytes_per_clip: float, videos: int) -> str:
    """The size of ``videos`` 10 s videos' clips, at ``CLIPS_PER_VIDEO``'s low and high counts."""
    low, high = (bytes_per_clip * videos * n for n in CLIPS_PER_VIDEO)
    return f"{_size(low)} - {_size(high)}"


def _fmt_psnr(value: float) -> str:
    return "lossless" if math.isinf(value) else f"{value:.2f}"


def encode_ways(codec: Codec, clips: list[np.ndarray], videos: list[str], rounds: int) -> tuple[float, float]:
    """Best CPU ms a frame of encoding every clip with one encoder per video (as a conversion does) and with a
    fresh encoder per clip (``codec.encode``), in interleaved rounds on this thread."""
    groups = [[clip for _, clip in group] for _, group in itertools.groupby(zip(videos, clips), key=lambda p: p[0])]
    frames = sum(c.shape[0] for c in clips)
    best = [math.inf, math.inf]
    for _ in range(rounds):
        t0 = time.thread_time()
        for video in groups:
            with codec.encoder() as encoder:
                for clip in video:
                    encoder.encode(clip)
        t1 = time.thread_time()
        for clip in clips:
            codec.encode(clip)
        t2 = time.thread_time()
        best = [min(best[0], (t1 - t0) / frames * 1e3), min(best[1], (t2 - t1) / frames * 1e3)]
    return best[0], best[1]


def print_encode_ways(clips: list[np.ndarray], videos: list[str], rounds: int) -> None:
    print(f"\nencoding, CPU ms/frame, best of {rounds} interleaved rounds: one encoder per video (a keyframe at each "
          f"clip's start) against a fresh encoder per clip; {len(clips)} clips of {len(set(videos))} videos\n")
    print(f"| {'codec':22} | {'per video':>9} | {'per clip':>8} | {'ratio':>5} |")
    print(f"|{'-' * 24}|{'-' * 11}|{'-' * 10}|{'-' * 7}|")
    for name in ("h264", "vp9"):
        codec = get_codec(name)
        per_video, per_clip = encode_ways(codec, clips, videos, rounds)
        print(f"| {row_label(codec):22} | {per_video:9.3f} | {per_clip:8.3f} | {per_video / per_clip:5.2f} |")


def print_tables(rows: list[Row], rates: dict[str, list[float]], clips: list[np.ndarray],
                 threads: int, rounds: int, title: str) -> None:
    frames = sum(c.shape[0] for c in clips)
    jpeg = next((r for r in rows if r.codec.name == "jpeg"), None)
    print(f"\n{title}: {len(clips)} clips of {clips[0].shape[0]}x{clips[0].shape[1]}x{clips[0].shape[2]}\n")
    print(f"| {'codec':22} | {'KB/clip':>8} | {'vs raw':>6} | {'vs jpeg':>7} | {'PSNR mean':>9} | {'PSNR min':>8} | "
          f"{'encode ms/frame':>15} |")
    print(f"|{'-' * 24}|{'-' * 10}|{'-' * 8}|{'-' * 9}|{'-' * 11}|{'-' * 10}|{'-' * 17}|")
    raw = next((r for r in rows if r.codec.name == "raw"), rows[0])
    for r in rows:
        kb = sum(map(len, r.payloads)) / len(r.payloads) / 1e3
        vs_raw = sum(map(len, raw.payloads)) / sum(map(len, r.payloads))
        vs_jpeg = f"{sum(map(len, r.payloads)) / sum(map(len, jpeg.payloads)):7.2f}" if jpeg else f"{'-':>7}"
        mean = math.inf if any(map(math.isinf, r.psnr)) else float(np.mean(r.psnr))
        print(f"| {r.label:22} | {kb:8.1f} | {vs_raw:6.1f} | {vs_jpeg} | {_fmt_psnr(mean):>9} | "
              f"{_fmt_psnr(min(r.psnr)):>8} | {r.encode_cpu_s / frames * 1e3:15.3f} |")
    print(f"\nCPU decoding, clips/s, best of {rounds} interleaved rounds: codec.decode (a new array per clip) and "
          f"codec.window into an array of the thread's own; {threads} threads share the clips out\n")
    print(f"| {'codec':22} | {'decode':>7} | {f'x{threads} threads':>10} | {'ratio':>5} | {'into':>7} | "
          f"{f'x{threads} threads':>10} | {'ratio':>5} | {'ms/frame':>8} |")
    print(f"|{'-' * 24}|{'-' * 9}|{'-' * 12}|{'-' * 7}|{'-' * 9}|{'-' * 12}|{'-' * 7}|{'-' * 10}|")
    for r in rows:
        one, many, one_into, many_into = rates[r.label]
        print(f"| {r.label:22} | {one:7.0f} | {many:10.0f} | {many / one:5.2f} | {one_into:7.0f} | "
              f"{many_into:10.0f} | {many_into / one_into:5.2f} | {1e3 / one_into / clips[0].shape[0]:8.3f} |")
    print(f"\nprojected size: bytes/clip x training videos x {CLIPS_PER_VIDEO[0]}-{CLIPS_PER_VIDEO[1]} clips "
          "(10 s at 25-30 fps, 16-frame clips without overlap)\n")
    heads = [f"{name} ({videos // 1000}k)" for name, videos in KINETICS_TRAIN.items()]
    print(f"| {'codec':22} | " + " | ".join(f"{h:>19}" for h in heads) + " |")
    print(f"|{'-' * 24}|" + "|".join("-" * 21 for _ in heads) + "|")
    for r in rows:
        per_clip = sum(map(len, r.payloads)) / len(r.payloads)
        print(f"| {r.label:22} | " + " | ".join(f"{projected(per_clip, v):>19}" for v in KINETICS_TRAIN.values())
              + " |")


def measure_all(clips: list[np.ndarray], videos: list[str], project: list[tuple[str, int | None]],
                others: list[tuple[type[VideoCodec], int]]) -> list[Row]:
    """A row per codec: the project's at their qualities, then the others (rows whose encoder fails are said)."""
    import av

    rows = [measure_row(get_codec(name, quality), clips, videos) for name, quality in project]
    for cls, quality in others:
        try:
            rows.append(measure_row(cls(quality), clips, videos))
        except (ValueError, av.FFmpegError) as exc:  # an encoder this PyAV build lacks, or refused settings
            print(f"{cls.name} CRF {quality}: left out ({type(exc).__name__}: {exc})")
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.codecs", description=__doc__)
    p.add_argument("--shared", default=DEFAULT_SHARED, help="folder with the real test videos")
    p.add_argument("--videos", default=None,
                   help="comma-separated file names in --shared (default: every video but the corrupted one)")
    p.add_argument("--max-clips", type=int, default=None,
                   help="clips per video the raw conversion keeps (default: all, as a default conversion)")
    p.add_argument("--threads", type=int, default=2,
                   help="threads of the concurrent decoding row (default 2)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved decoding rounds; the best of each is shown")
    p.add_argument("--no-others", action="store_true", help="leave out the hevc and av1 rows")
    p.add_argument("--tmp", default=None, help="scratch folder (default: a temp dir, removed after)")
    args = p.parse_args(argv)
    os.environ.setdefault("SVT_LOG", "1")  # SVT-AV1 prints its settings at every encoder's start: errors only
    names = [n.strip() for n in args.videos.split(",") if n.strip()] if args.videos else None
    with scratch_folder(args.tmp, "codecs-bench-") as scratch:
        stored = raw_clips(args.shared, scratch, names=names, max_clips=args.max_clips, workers=min(2, cpu_count()))
    videos, clips = [v for v, _ in stored], [c for _, c in stored]
    if not clips:
        raise SystemExit(f"no clips: the videos in {args.shared} are shorter than a clip")
    rows = measure_all(clips, videos, PROJECT_ROWS, [] if args.no_others else OTHER_ROWS)
    rates = decode_rates(rows, clips[0].shape, args.threads, args.rounds)
    used = ", ".join(names or video_names(args.shared))
    print_tables(rows, rates, clips, args.threads, args.rounds, f"raw conversion of {used}")
    print_encode_ways(clips, videos, args.rounds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
