"""How a job runs (never what it produces), and every option of ``python -m convert`` and its sub-commands.

``JobOptions`` is what the job is given: parallelism, shard count, the shard
processes' knobs, Dask. ``ConvertOptions``, ``InspectOptions`` and
``DemoOptions`` declare the command lines, each option once
(``convert.format.options.option``: name, type, default, range, help), as the
trainer's are declared on ``TrainConfig``; the backends declare their own
writing options and the shard cache its settings the same way. The defaults of
what the job is given come from the classes that hold them (``ConvertConfig``,
``ShardOptions``, ``JobOptions``), so a default is written once.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass

from .format import BACKENDS, WRITE_CODECS
from .format.layout import MAX_CLIP_INDEX
from .format.options import option, option_from
from .format.units import MAX_BYTES
from .job.supervise import ShardOptions
from .worker.clips import SHORT_POLICIES, TAIL_POLICIES
from .worker.plan import DAMAGE_POLICIES, ConvertConfig

# The ranges of the running options (checked as the command line is parsed): wide enough for any real
# job, and each bound what the code can honour (a poll timeout holds its milliseconds in a C int; more
# FFmpeg threads per video only add start-up; a shard process needs some heap before its first video).
MAX_WORKERS = 4096
MAX_SHARDS = 100_000
MAX_TIMEOUT = 7 * 24 * 3600.0  # seconds
MAX_RETRIES = 100
MAX_DECODE_THREADS = 64
MIN_MEMORY = 256 << 20  # bytes
MAX_FRAMES = MAX_CLIP_INDEX  # clip indices and start frames are uint32 in every clip header
MAX_CLIP_LEN = 65535
MAX_SIDE = 8192  # pixels, the largest frame side a conversion is asked for


@dataclass(frozen=True)
class JobOptions:
    """How to run (not what to produce): parallelism, timeouts, shard count."""

    workers: int = 0  # 0: every core
    shards: int | None = None
    shard: ShardOptions = ShardOptions()
    dask: str | None = None  # scheduler address, or "local" for a LocalCluster
    progress: bool = True  # the tqdm bar (the command line's choice: on a terminal, without --no-progress)
    # Seconds between progress lines where no bar is drawn (a log, a pipe); None: no lines.
    progress_every: float | None = None


def parse_size(text: str) -> tuple[int, int]:
    """``--size``: ``HxW``, each side in 2..MAX_SIDE pixels."""
    m = re.fullmatch(r"(\d+)[xX](\d+)", text.strip())
    if not m or not all(2 <= int(n) <= MAX_SIDE for n in m.groups()):
        raise argparse.ArgumentTypeError(f"size must be HxW (height x width, each 2..{MAX_SIDE}, e.g. 128x171), "
                                         f"got {text!r}")
    return int(m.group(1)), int(m.group(2))


def parse_short_side(text: str) -> int:
    """``--short-side``: a whole number of pixels in 2..MAX_SIDE, refused in words that point at ``--size``."""
    if not text.strip().isascii() or not text.strip().isdigit() or not 2 <= int(text) <= MAX_SIDE:
        raise argparse.ArgumentTypeError(f"must be a whole number of pixels in 2..{MAX_SIDE} (the shorter side of "
                                         f"every frame; or give --size HxW), got {text!r}")
    return int(text)


SOURCE, OUTPUT, RUNNING = "source", "output", "running"
_DEFAULT_SIZE = ConvertConfig.size or (0, 0)  # the frame size a conversion gets without --size or --short-side


@dataclass(frozen=True, kw_only=True)
class ConvertOptions:
    """The options of ``python -m convert SRC OUT``, one field each (``cli.config_from_args`` makes the job's
    ``ConvertConfig``, ``ShardOptions`` and ``JobOptions`` from the parsed values); the backends' own options
    (``--map-size``, ``--part-size``...) are declared by the backends and added beside ``RUNNING``."""

    videos: str | None = option(
        SOURCE, "video root for a CSV or list file (a CSV needs it; a list file defaults to its own folder). "
                "Entries are checked lexically, after normalising '..': one that leaves the root is rejected; "
                "symlinks inside the root are followed wherever they point, by design", metavar="DIR")
    split: str | None = option(SOURCE, "CSV only (refused with another SRC): keep rows whose 'split' column "
                                       "equals this (train, val, test)")
    classes_file: str | None = option(
        SOURCE, "class names, one per line, fixing label order (without it: the sorted labels of every row of a "
                "CSV, all splits; of the entries found otherwise)", flag="--classes", metavar="FILE")
    add_new: bool = option(
        SOURCE, "rerun only: convert the videos the source holds but the plan lacks (added since the first run) "
                "into new shards; the existing shards are kept byte for byte (--shards then sets how many new "
                "shards)", default=False)
    staging: str | None = option(
        OUTPUT, "with OUT a URL: the local folder the job writes before uploading (without it: one per URL under "
                "~/.cache/videoclips/staging); a rerun needs the same one to skip finished work", metavar="DIR")
    backend: str = option(
        OUTPUT, "shard store: " + "; ".join(f"{b.name} ({b.summary})" for b in BACKENDS.values()),
        default=ConvertConfig.backend, choices=tuple(BACKENDS))
    codec: str = option(
        OUTPUT, "clip payload: " + "; ".join(f"{name} ({codec.summary})" for name, codec in WRITE_CODECS.items()),
        default=ConvertConfig.codec, choices=tuple(WRITE_CODECS))
    quality: int | None = option(
        OUTPUT, "the lossy codecs' quality on their own scale (without it: " + ", ".join(
            f"{name} {cls.default_quality}" for name, cls in WRITE_CODECS.items() if cls.quality_range) +
        "): " + "; ".join(f"{name} {cls.quality_range[0]}-{cls.quality_range[1]}" + (" (CRF, lower is better)"
                                                                                   if cls.records_default_quality
                                                                                   else "")
                          for name, cls in WRITE_CODECS.items() if cls.quality_range),
        ge=0, le=100, metavar="Q")
    size: tuple[int, int] | None = option(
        OUTPUT, f"resize every frame to H x W (without it or --short-side: {_DEFAULT_SIZE[0]}x{_DEFAULT_SIZE[1]}, "
                f"the C3D input before cropping)", parse=parse_size, metavar="HxW", exclusive="size")
    short_side: int | None = option(OUTPUT, "resize so the shorter side is S, keeping aspect", ge=2, le=MAX_SIDE,
                                    parse=parse_short_side, metavar="S", exclusive="size")
    fps: float | None = option(OUTPUT, "resample to this frame rate by timestamps (without it: every frame kept)",
                               gt=0, le=1000)
    clip_len: int = option(OUTPUT, "frames per clip", default=ConvertConfig.clip_len, ge=1, le=MAX_CLIP_LEN)
    stride: int = option(OUTPUT, "take every Nth frame inside a clip", default=ConvertConfig.stride, ge=1,
                         le=MAX_CLIP_LEN)
    step: int | None = option(OUTPUT, "frames between clip starts (without it: clip-len x stride, no overlap)",
                              ge=1, le=MAX_FRAMES)
    max_clips: int | None = option(OUTPUT, "at most this many clips per video (the first ones)", ge=1,
                                   le=MAX_FRAMES)
    short: str = option(OUTPUT, "a video shorter than one clip: skip it, loop it, or repeat its last frame",
                        default=ConvertConfig.short, choices=SHORT_POLICIES)
    tail: str = option(OUTPUT, "the frames after a video's last whole clip: keep them in one more clip, the "
                               "video's last --clip-len frames (where clips tile the video: --stride 1, --step "
                               "--clip-len; so every frame is stored), or drop them",
                       default=ConvertConfig.tail, choices=TAIL_POLICIES)
    on_damage: str = option(OUTPUT, "a video that breaks part-way: keep the clips before the damage, or skip it",
                            default=ConvertConfig.on_damage, choices=DAMAGE_POLICIES)
    workers: int = option(RUNNING, "parallel shard processes (0: every core)", default=JobOptions.workers, ge=0,
                          le=MAX_WORKERS)
    shards: int | None = option(RUNNING, "number of shards (without it: 2 per worker, at most 1000 videos each); "
                                         "fixed at the first run", ge=1, le=MAX_SHARDS)
    video_timeout: float = option(
        RUNNING, "seconds one video's decoding may take before its decoder is killed and the video recorded (the "
                 "time the video takes outside its decoder is not counted)", default=ShardOptions.video_timeout,
        gt=0, le=MAX_TIMEOUT)
    retries: int = option(RUNNING, "retries of a video whose decoder crashed or hung",
                          default=ShardOptions.retries, ge=0, le=MAX_RETRIES)
    retry_failed: bool = option(
        RUNNING, "rerun only: convert again the videos recorded as failed (report.jsonl), finished job or not; a "
                 "video's record is replaced by the new attempt's", default=False)
    decode_threads: int = option(
        RUNNING, "FFmpeg threads per video (one process per core is faster than more; 0 = FFmpeg decides)",
        default=ShardOptions.threads, ge=0, le=MAX_DECODE_THREADS)
    max_memory: int | None = option(
        RUNNING, "heap limit per shard process, e.g. 4G: a video that needs more is recorded as failed instead of "
                 "calling the OOM killer (without it: no limit)", byte_count=True, ge=MIN_MEMORY, le=MAX_BYTES,
        metavar="BYTES")
    dask: str | None = option(RUNNING, "run shards on a Dask cluster (scheduler address, or 'local'); OUT must be "
                                       "on storage every Dask worker sees", metavar="ADDRESS")
    no_progress: bool = option(RUNNING, "no progress bar (on a terminal), no progress line every minute (written "
                                        "to a log or a pipe)", default=False)
    json: bool = option(RUNNING, "print the summary as JSON", default=False)


def parse_fingerprint(text: str) -> str:
    """A content fingerprint as given on the command line: 64 hex digits (either case), kept in lowercase."""
    if not re.fullmatch(r"[0-9a-fA-F]{64}", text):
        raise argparse.ArgumentTypeError(f"a fingerprint is 64 hex digits (as inspect prints it), got {text[:70]!r}")
    return text.lower()


@dataclass(frozen=True, kw_only=True)
class VerifyOptions:
    """The options of ``python -m convert verify OUT`` (besides the shard cache's, for a URL)."""

    fingerprint: str | None = option(
        "verify", "the content fingerprint of a copy you trust (inspect prints it): verify fails unless this "
                  "conversion's stored bytes give the same", metavar="HEX", parse=parse_fingerprint)


@dataclass(frozen=True, kw_only=True)
class InspectOptions:
    """The options of ``python -m convert inspect OUT`` (and the shard cache's, for a URL)."""

    sheet: str | None = option("inspect", "write a contact sheet of sample clips", metavar="FILE.png")
    rows: int = option("inspect", "clips on the sheet", default=8, ge=1, le=1000)
    against: str | None = option(
        "inspect", "compare with a Kinetics annotation list: per class, the videos it annotates and how many were "
                   "converted, are missing, failed or are short", metavar="CSV")
    split: str | None = option("inspect", "with --against: only the CSV's rows of this split")
    json: bool = option("inspect", "print the summary (and --against) as one JSON object", default=False)


@dataclass(frozen=True, kw_only=True)
class DemoOptions:
    """The options of ``python -m convert demo`` (``python -m train demo`` takes its ``--out``)."""

    out: str = option("demo", "folder for videos, shards and the contact sheet", default="demo_out")
    per_class: int = option("demo", "training videos per class", default=16, ge=1, le=10_000)
    seconds: float = option("demo", "approximate length of each video, in seconds", default=2.0, gt=0, le=600)
    workers: int = option("demo", "parallel shard processes (0: every core)", default=JobOptions.workers, ge=0,
                          le=MAX_WORKERS)
    codec: str = option_from(ConvertOptions, "codec", group="demo")


__all__ = ["MAX_DECODE_THREADS", "MAX_RETRIES", "MAX_SHARDS", "MAX_TIMEOUT", "MAX_WORKERS", "MIN_MEMORY",
           "ConvertOptions", "DemoOptions", "InspectOptions", "JobOptions", "VerifyOptions", "parse_fingerprint",
           "parse_short_side", "parse_size"]
