"""Command line: ``python -m convert SRC OUT [options]`` and its sub-commands.

    python -m convert SRC OUT ...     convert a dataset into clip shards
    python -m convert verify OUT      check every shard against the manifest
    python -m convert inspect OUT     summarise, optionally draw a contact sheet
    python -m convert demo [--out D]  synthesise a small dataset and convert it
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import errno
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

from .argtypes import MAX_BYTES, OneLineParser, byte_count, number, parse_bytes, parse_short_side, parse_size, whole
from .format import BACKENDS, WRITE_CODECS, StoreError
from .format.layout import MAX_CLIP_INDEX
from .job.childproc import Stopped
from .job.progress import line_interval
from .job.summary import print_summary
from .job.supervise import ShardFailed, ShardOptions
from .options import MAX_DECODE_THREADS, MAX_RETRIES, MAX_SHARDS, MAX_TIMEOUT, MAX_WORKERS, MIN_MEMORY, JobOptions
from .signals import STOP_SIGNALS, take_stop_signals
from .store.remote import Remote, RemoteError, check_url, is_url
from .worker.clips import SHORT_POLICIES
from .worker.plan import DAMAGE_POLICIES, ConvertConfig, PlanError
from .worker.sources import SourceError, split_problem

SUBCOMMANDS = ("verify", "inspect", "demo")

MAX_FRAMES = MAX_CLIP_INDEX  # clip indices and start frames are uint32 in every clip header


def add_convert_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("source")
    g.add_argument("--videos", metavar="DIR", help="video root for a CSV or list file (a CSV needs it; a list "
                   "file defaults to its own folder). Entries are checked lexically, after normalising '..': "
                   "one that leaves the root is rejected; symlinks inside the root are followed wherever they "
                   "point, by design")
    g.add_argument("--split", help="CSV only (refused with another SRC): keep rows whose 'split' column equals this "
                                   "(train, val, test)")
    g.add_argument("--classes", metavar="FILE", dest="classes_file",
                   help="class names, one per line, fixing label order (default: the sorted labels of every row "
                   "of a CSV, all splits; of the entries found otherwise)")
    g.add_argument("--add-new", action="store_true",
                   help="rerun only: convert the videos the source holds but the plan lacks (added since the "
                        "first run) into new shards; the existing shards are kept byte for byte (--shards then "
                        "sets how many new shards)")
    g = p.add_argument_group("output")
    g.add_argument("--backend", default="lmdb", choices=list(BACKENDS),
                   help="shard store: " + "; ".join(f"{b.name} ({b.summary})" for b in BACKENDS.values())
                        + "; default lmdb")
    g.add_argument("--codec", default="raw", choices=list(WRITE_CODECS),
                   help="clip payload: " + "; ".join(f"{name} ({codec.summary})"
                                                     for name, codec in WRITE_CODECS.items()) + "; default raw")
    size = g.add_mutually_exclusive_group()
    size.add_argument("--size", type=parse_size, default=None, metavar="HxW",
                      help="resize every frame to H x W (default 128x171, the C3D input before cropping)")
    size.add_argument("--short-side", type=parse_short_side, metavar="S",
                      help="resize so the shorter side is S, keeping aspect")
    g.add_argument("--fps", type=number(0, 1000, above=True),
                   help="resample to this frame rate by timestamps (default: keep every frame)")
    g.add_argument("--clip-len", type=whole(1, 65535), default=16, help="frames per clip (default 16)")
    g.add_argument("--stride", type=whole(1, 65535), default=1, help="take every Nth frame inside a clip (default 1)")
    g.add_argument("--step", type=whole(1, MAX_FRAMES),
                   help="frames between clip starts (default clip-len x stride: no overlap)")
    g.add_argument("--max-clips", type=whole(1, MAX_FRAMES), help="at most this many clips per video (the first ones)")
    g.add_argument("--short", default="skip", choices=SHORT_POLICIES,
                   help="a video shorter than one clip: skip it, loop it, or repeat its last frame (default skip)")
    g.add_argument("--on-damage", default="keep", choices=DAMAGE_POLICIES,
                   help="a video that breaks part-way: keep the clips before the damage, or skip it (default keep)")
    g = p.add_argument_group("running")
    g.add_argument("--workers", type=whole(0, MAX_WORKERS), default=0,
                   help="parallel shard processes (default: every core)")
    g.add_argument("--shards", type=whole(1, MAX_SHARDS),
                   help="number of shards (default: 2 per worker, at most 1000 videos each); fixed at the first run")
    g.add_argument("--video-timeout", type=number(0, MAX_TIMEOUT, "of seconds", above=True), default=300.0,
                   help="seconds one video's decoding may take before its decoder is killed and the video recorded "
                        "(default 300; the time the video takes outside its decoder is not counted)")
    g.add_argument("--retries", type=whole(0, MAX_RETRIES), default=1,
                   help="retries of a video whose decoder crashed or hung (default 1)")
    g.add_argument("--retry-failed", action="store_true",
                   help="rerun only: convert again the videos recorded as failed (report.jsonl), finished job "
                        "or not; a video's record is replaced by the new attempt's")
    g.add_argument("--decode-threads", type=whole(0, MAX_DECODE_THREADS), default=1,
                   help="FFmpeg threads per video (default 1: one process per core is faster; 0 = FFmpeg decides)")
    add_store_options(g)
    g.add_argument("--max-memory", type=byte_count(MIN_MEMORY), metavar="BYTES",
                   help="heap limit per shard process, e.g. 4G: a video that needs more is recorded as failed "
                        "instead of calling the OOM killer (default: no limit)")
    g.add_argument("--dask", metavar="ADDRESS", help="run shards on a Dask cluster (scheduler address, or 'local'); "
                   "OUT must be on storage every Dask worker sees")
    g.add_argument("--no-progress", action="store_true",
                   help="no progress bar (on a terminal), no progress line every minute (written to a log or a pipe)")
    g.add_argument("--json", action="store_true", help="print the summary as JSON")


def store_flags() -> dict[str, tuple[str, dataclasses.Field]]:
    """Every backend's writing options as ``{argparse dest: (backend name, its field)}``, from their declarations."""
    return {f"store_{name}_{f.name}": (name, f) for name, backend in BACKENDS.items()
            for f in dataclasses.fields(backend.options)}


def store_value_type(backend: str, f: dataclasses.Field) -> Callable[[str], Any]:
    """The argparse type of a backend's valued option: parsed, then checked by the backend's options dataclass.

    The dataclass holds the rule (its ``__post_init__``); asking it here makes a value it refuses a
    usage error of the flag, before any work.
    """
    read = parse_bytes if f.metadata.get("parse") == "bytes" else whole(-MAX_BYTES, MAX_BYTES)

    def parse(text: str) -> Any:
        value = read(text)
        try:
            BACKENDS[backend].make_options({f.name: value})
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return value

    parse.__name__ = f.name
    return parse


def add_store_options(g: argparse._ArgumentGroup) -> None:
    """The backends' own options (``convert.format.base.option``), each under its backend's flag."""
    for dest, (name, f) in store_flags().items():
        kind = f.metadata.get("parse", "value")
        if kind == "switch":
            g.add_argument(f.metadata["flag"], dest=dest, action="store_true", default=None, help=f.metadata["help"])
        else:
            g.add_argument(f.metadata["flag"], dest=dest, default=None, help=f.metadata["help"],
                           type=store_value_type(name, f), metavar="BYTES" if kind == "bytes" else None)


def store_options(args: argparse.Namespace, backend: str) -> Any:
    """The chosen backend's options dataclass from the parsed flags; ValueError naming a flag of another backend."""
    values = {}
    for dest, (name, f) in store_flags().items():
        value = getattr(args, dest, None)
        if value is None:
            continue
        if name != backend:
            raise ValueError(f"{f.metadata['flag']} is an option of the {name} backend; this job writes {backend}")
        values[f.name] = value
    return BACKENDS[backend].make_options(values)


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="python -m convert",
        description="Decode every video once into fixed-length uint8 RGB clips stored in shards. "
                    "Restartable: run the same command again after any interruption.",
        epilog="Sub-commands: 'python -m convert verify OUT' checks every shard against the manifest; "
               "'python -m convert inspect OUT [--sheet FILE.png]' summarises and draws sample clips; "
               "'python -m convert demo' synthesises a small dataset and converts it. "
               "Exit status: 0 done; 1 the job failed (a shard's store or process; the message names its log); "
               "2 bad arguments or an OUT that cannot take this job; 130 (SIGINT, Ctrl-C) or 143 (SIGTERM) "
               "interrupted: run the same command again to continue.",
    )
    p.add_argument("src", metavar="SRC", help="a Kinetics CSV (with --videos), a list file ('path label' lines), "
                   "or a folder of class folders")
    p.add_argument("out", metavar="OUT", help="output folder: shards/, manifest.json, report.jsonl, plan.json, logs/; "
                                              "or a URL (s3://, gs://, file://...): written into --staging, "
                                              "each shard verified and uploaded, the manifest last")
    p.add_argument("--staging", metavar="DIR", help="with OUT a URL: the local folder the job writes before "
                                                    "uploading (default: one per URL under ~/.cache/videoclips/"
                                                    "staging); a rerun needs the same one to skip finished work")
    add_convert_options(p)
    return p


def config_from_args(args: argparse.Namespace) -> tuple[ConvertConfig, JobOptions]:
    size = None if args.short_side is not None else (args.size or (128, 171))
    config = ConvertConfig(backend=args.backend, codec=args.codec, size=size, short_side=args.short_side,
                           fps=args.fps, clip_len=args.clip_len, stride=args.stride, step=args.step,
                           max_clips=args.max_clips, short=args.short, on_damage=args.on_damage)
    shard = ShardOptions(video_timeout=args.video_timeout, retries=args.retries, threads=args.decode_threads,
                         store=store_options(args, config.backend), max_memory=args.max_memory)
    # On a terminal a bar; written to a log or a pipe, where a bar is no use, a line at an interval instead.
    terminal = sys.stderr.isatty()
    opts = JobOptions(workers=args.workers, shards=args.shards, shard=shard, dask=args.dask,
                      progress=not args.no_progress and terminal,
                      progress_every=None if args.no_progress or terminal else line_interval())
    return config, opts


# OSErrors that say the path the user gave cannot be used (status 2, like any argument the job cannot
# take); every other one is a failure of the machine (a full disk, an I/O error: status 1).
USER_ERRNOS = frozenset({errno.ENOENT, errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EISDIR,
                         errno.EEXIST, errno.ENAMETOOLONG, errno.ELOOP})


def os_error_status(exc: OSError) -> int:
    """The exit status of a job stopped by ``exc``: 2 when its path cannot take the job, 1 when the machine failed."""
    return 2 if exc.errno in USER_ERRNOS else 1


def describe_os_error(exc: OSError) -> str:
    """``exc`` as one line naming its file: a ``StoreError`` says it already; Python's own says it after the text."""
    if isinstance(exc, StoreError) or not exc.filename:
        return str(exc)
    names = f"{exc.filename} -> {exc.filename2}" if exc.filename2 else str(exc.filename)
    return f"{names}: {exc.strerror or exc}"


INTERRUPTED = "convert: interrupted; rerun the same command to continue"
STOP_WAIT = 5.0  # seconds the stop waits for the killed children to be reaped, then for the fork server


def _stop_children() -> None:
    from .job import childproc
    from .worker import forkserver

    childproc.stop_all(STOP_WAIT)
    forkserver.shutdown(STOP_WAIT)


def _interrupted(signum: int, frame: object) -> None:
    """Stop the job at once, as safely as kill -9 (each video commits atomically), but cleanly.

    Every child is killed and reaped (none is left running), one line is
    said, and the process ends with 128 + the signal's number, without a
    traceback from any thread: a KeyboardInterrupt in the middle of joblib's
    wait, or a supervisor recording a shard process that this very signal
    killed, would be neither quiet nor safe.
    """
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)  # a second Ctrl-C must not interrupt the stop
    _stop_children()
    os.write(2, (INTERRUPTED + "\n").encode())  # not print: the signal may have come in the middle of one
    os._exit(128 + signum)


def _stop_on_signals() -> dict:
    """SIGINT and SIGTERM stop the job through ``_interrupted``; one this process was started ignoring
    (``nohup``, a shell's background job) stays ignored. Returns the handlers replaced, to put back."""
    if threading.current_thread() is not threading.main_thread():
        return {}  # only the main thread may set handlers; the caller's own handling stays
    return take_stop_signals(_interrupted)


def _mistyped_subcommand(argv: list[str]) -> str | None:
    """The sub-command a first argument that is no file was probably meant to be ("verfy" -> "verify")."""
    if not argv or argv[0].startswith("-") or os.path.exists(argv[0]):
        return None
    close = difflib.get_close_matches(argv[0], SUBCOMMANDS, n=1, cutoff=0.6)
    return close[0] if close else None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in SUBCOMMANDS:
        from . import tools

        return tools.main(argv)
    meant = _mistyped_subcommand(argv)
    if meant:
        suggestion = " ".join(["python -m convert", meant, *argv[1:]])
        print(f"convert: error: {argv[0]}: no such file or directory, nor a sub-command; "
              f"did you mean '{suggestion}'?", file=sys.stderr)
        return 2
    parser = build_parser()
    args = parser.parse_args(argv)
    split_error = split_problem(args.src, args.split)
    if split_error is not None:
        parser.error(split_error)  # a usage error (status 2) before any work, as a bad option value is
    previous = _stop_on_signals()
    try:
        return _convert(args)
    finally:
        for sig, handler in previous.items():  # main() called in a process of its own (tests, a notebook)
            signal.signal(sig, handler)


def _convert(args: argparse.Namespace) -> int:
    try:
        config, opts = config_from_args(args)
        from .job.run import run_job

        say = lambda note: print(f"convert: {note}", file=sys.stderr)  # noqa: E731 - passed twice below
        target = args.out
        if is_url(args.out):
            from .store.upload import staging_dir

            check_url(args.out)  # before any work: "s3://" alone names no bucket
            target = staging_dir(args.out, args.staging)
            try:
                Remote(args.out).check_writable()  # a wrong bucket is found now, not after the conversion
            except RemoteError as exc:
                print(f"convert: error: {exc} (nothing was converted)", file=sys.stderr)
                return 1
        elif args.staging:
            raise ValueError("--staging is for an OUT that is a URL")
        result = run_job(args.src, target, config, opts, videos=args.videos, split=args.split,
                         classes_file=args.classes_file, add_new=args.add_new, retry_failed=args.retry_failed,
                         say=say, staging_of=args.out if target != args.out else None)
        if target != args.out:
            from .store.upload import upload_conversion

            counts = upload_conversion(target, args.out, say=say if not args.json else lambda note: None)
            result = {**result, "staging": target, **counts}
    except RemoteError as exc:  # names the URL and the reason; the staging folder keeps the work done
        advice = ("rerun the same command to upload what is missing" if exc.transient else
                  "the work done is kept: fix that, then rerun the same command")
        print(f"convert: error: {exc} ({advice})", file=sys.stderr)
        return 1
    except Stopped as exc:
        # A child died of a stop signal sent to the whole process group, seen before the signal reached this
        # process's handler: the same stop.
        _stop_children()
        print(INTERRUPTED, file=sys.stderr)
        return 128 + (exc.signum or signal.SIGTERM)
    except ShardFailed as exc:
        # Not the user's input: a shard's store or process; the log named holds the rest.
        print(f"convert: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"convert: error: {describe_os_error(exc)}", file=sys.stderr)
        return os_error_status(exc)
    except (SourceError, PlanError, ValueError) as exc:
        print(f"convert: error: {exc}", file=sys.stderr)
        return 2
    print_summary(args.out, result, args.json)
    return 0
