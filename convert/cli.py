"""Command line: ``python -m convert SRC OUT [options]`` and its sub-commands.

    python -m convert SRC OUT ...     convert a dataset into clip shards
    python -m convert verify OUT      check every shard against the manifest
    python -m convert inspect OUT     summarise, optionally draw a contact sheet
    python -m convert demo [--out D]  synthesise a small dataset and convert it
"""

from __future__ import annotations

import argparse
import difflib
import errno
import os
import signal
import sys
import threading
from typing import Any

from .format import BACKENDS, StoreError
from .format.options import OneLineParser, Setting, add_options, settings
from .job.childproc import Stopped
from .job.progress import line_interval
from .job.summary import print_summary
from .job.supervise import ShardFailed, ShardOptions
from .options import RUNNING, ConvertOptions, JobOptions
from .signals import STOP_SIGNALS, say, take_stop_signals
from .store.remote import Remote, RemoteError, check_url, is_url
from .worker.plan import ConvertConfig, PlanError
from .worker.sources import SourceError, split_problem

SUBCOMMANDS = ("verify", "inspect", "demo")


def add_convert_options(p: argparse.ArgumentParser) -> None:
    """Every option of ``python -m convert SRC OUT``: those declared on ``ConvertOptions``, then the backends'."""
    groups = add_options(p, ConvertOptions)
    add_store_options(groups[RUNNING])


def store_flags() -> dict[str, tuple[str, Setting]]:
    """Every backend's writing options as ``{argparse dest: (backend name, its declaration)}``."""
    return {f"store_{name}_{s.name}": (name, s) for name, backend in BACKENDS.items()
            for s in settings(backend.options).values()}


def add_store_options(g: argparse._ArgumentGroup) -> None:
    """The backends' own options, each under its backend's flag, checked as declared (None: not given)."""
    for dest, (_, s) in store_flags().items():
        # None: not given (a flag of another backend is refused by name); the help shows the declared default.
        s.add_to(g, dest=dest, default=None, help=s.help_text())


def store_options(args: argparse.Namespace, backend: str) -> Any:
    """The chosen backend's options dataclass from the parsed flags; ValueError naming a flag of another backend."""
    values = {}
    for dest, (name, s) in store_flags().items():
        value = getattr(args, dest, None)
        if value is None:
            continue
        if name != backend:
            raise ValueError(f"{s.flag} is an option of the {name} backend; this job writes {backend}")
        values[s.name] = value
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
               "2 bad arguments or an OUT that cannot take this job; 130 (SIGINT, Ctrl-C), 143 (SIGTERM) or 129 "
               "(SIGHUP: a closed terminal) interrupted: run the same command again to continue.",
    )
    p.add_argument("src", metavar="SRC", help="a Kinetics CSV (with --videos), a list file ('path label' lines), "
                   "or a folder of class folders")
    p.add_argument("out", metavar="OUT", help="output folder: shards/, manifest.json, report.jsonl, plan.json, logs/; "
                                              "or a URL (s3://, gs://, file://...): written into --staging, "
                                              "each shard verified and uploaded, the manifest last")
    add_convert_options(p)
    return p


def config_from_args(args: argparse.Namespace) -> tuple[ConvertConfig, JobOptions]:
    size = None if args.short_side is not None else (args.size or ConvertConfig.size)
    config = ConvertConfig(backend=args.backend, codec=args.codec, size=size, short_side=args.short_side,
                           fps=args.fps, clip_len=args.clip_len, stride=args.stride, step=args.step,
                           max_clips=args.max_clips, short=args.short, tail=args.tail, on_damage=args.on_damage,
                           quality=args.quality)
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
    say(INTERRUPTED)
    os._exit(128 + signum)


def _stop_on_signals() -> dict:
    """The stop signals (SIGINT, SIGTERM, SIGHUP) stop the job through ``_interrupted``; one this process was
    started ignoring (``nohup``, a shell's background job) stays ignored. Returns the handlers replaced, to put back."""
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
