"""Run one shard: start its writer process, feed it videos, survive its deaths.

This runs inside a joblib (or Dask) worker and is light: it never decodes or
touches the store. When the shard process dies or hangs on a video, that video
is retried once in a fresh process and then recorded as failed, and the shard
goes on with the next video.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..format import LOG_DIR, PROGRESS_DIR, StoreError, shard_name
from ..format.errors import storing
from ..signals import STOP_SIGNALS
from ..worker import forkserver
from ..worker.plan import ShardPlan
from ..worker.shard_worker import DECODING, plan_command
from .childproc import LineProcess, Stopped, use_forkserver

_MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(256 << 20),
               "MALLOC_TOP_PAD_": str(64 << 20)}
# The folder that holds the ``convert`` package (this file is convert/job/supervise.py): what a child
# Python needs on its path to run this very copy.
_PKG_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclass(frozen=True)
class ShardOptions:
    """Per-run knobs that do not change the stored bytes.

    ``store``: the backend's own writing options (its options dataclass,
    e.g. ``LmdbOptions(map_size=...)``), None for its defaults.
    """

    video_timeout: float = 300.0
    retries: int = 1
    threads: int = 1
    store: Any = None
    max_memory: int | None = None  # bytes of heap per shard process (RLIMIT_DATA)


class ShardFailed(RuntimeError):
    """A shard process failed outside any video (starting, finishing): the job cannot go on.

    The message names the shard, the cause (from the shard's log when it says
    one) and the log.
    """


class ShardMachineFailed(ShardFailed):
    """A shard stopped by the machine, not by a video: the store failed (full disk, I/O error) or no process can
    be started. The job stops, and no video is recorded as failed for it."""


# A shard process killed by SIGBUS while OUT's device has less than this free
# was writing into a memory-mapped store that could not grow: a full disk.
LOW_SPACE = 256 << 20


def machine_cause(out: str, rc: int | None) -> str | None:
    """Why a shard process's death is the machine's fault, or None when the video may be to blame."""
    if rc != -signal.SIGBUS:
        return None
    free = shutil.disk_usage(out).free
    if free >= LOW_SPACE:
        return None
    return (f"shard process killed by SIGBUS while {out}'s device has only {free} bytes free "
            f"(a write into the memory-mapped store failed)")


def describe_exit(rc: int | None, what: str = "decoder process") -> str:
    if rc is not None and rc < 0:
        name = signal.Signals(-rc).name
        hint = " (out of memory?)" if -rc == signal.SIGKILL else ""
        return f"{what} killed by {name}{hint}"
    return f"{what} exited with status {rc}"


def last_error(text: str) -> str | None:
    """The exception line of the last Python traceback in ``text`` ("lmdb.CorruptedError: ..."), if any."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")]
    if not starts:
        return None
    for line in lines[starts[-1] + 1:]:
        if line.strip() and not line[0].isspace():
            return line.strip()
    return None


def package_env() -> dict[str, str]:
    """Our environment with this package first on PYTHONPATH: a child Python runs this very copy of it."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [_PKG_ROOT, os.environ.get("PYTHONPATH")])))


def shard_env() -> dict[str, str]:
    """The environment of a shard process: ``package_env()``, glibc's heap kept."""
    env = package_env()
    # Every clip allocates a few MB (frames, the value, LMDB's overflow
    # pages) and frees them again. glibc would hand such blocks back to the
    # kernel each time and fault fresh zeroed pages in for the next clip;
    # keeping them in the heap measured faster (docs/benchmarks.md).
    for name, value in _MALLOC_ENV.items():
        env.setdefault(name, value)
    return env


def prestart() -> None:
    """Start the fork server now, so that its imports overlap the job's planning."""
    if use_forkserver():
        forkserver.prestart(shard_env())


def _phase_memory() -> int | None:
    """A one-byte memory file the shard process marks its phase in (``shard_worker.set_phase``); None without
    memfd (not Linux), where a signal death while converting a video is taken for its decoder's, as before."""
    try:
        fd = os.memfd_create("convert-shard-phase", getattr(os, "MFD_CLOEXEC", 0))
    except (AttributeError, OSError):
        return None
    os.ftruncate(fd, 1)
    return fd


# Seconds a shard process has to take its shard's plan, and then to say it is ready.
START_TIMEOUT_S = 120.0


def shard_log(out: str, index: int) -> str:
    """The log of shard ``index``'s processes (what they print, their tracebacks)."""
    return os.path.join(out, LOG_DIR, shard_name(index) + ".log")


class _Child(LineProcess):
    """The shard process of ``shard`` and its line protocol; started, and sent the shard's plan (its first line:
    the process reads nothing else of the plan). TimeoutError when it takes no plan within ``START_TIMEOUT_S``
    (it is then killed)."""

    def __init__(self, out: str, shard: ShardPlan, opts: ShardOptions) -> None:
        index = shard.index
        self.log_path = shard_log(out, index)
        with storing("opening the shard's log", self.log_path):
            os.makedirs(os.path.dirname(self.log_path), exist_ok=True)
            log = open(self.log_path, "ab")
        self._log_start = log.tell()  # this process's part of the log starts here
        args = {"threads": opts.threads, "store": dataclasses.asdict(opts.store) if opts.store is not None else None,
                "max_memory": opts.max_memory}
        self._phase = _phase_memory()
        keep = () if self._phase is None else (self._phase,)

        def argv(fds: list[int]) -> list[str]:
            return [out, str(index), json.dumps({**args, "phase_fd": fds[0] if fds else None})]

        try:
            super().__init__(module="convert.worker.shard_worker", argv=argv, env=shard_env(), stderr=log.fileno(),
                             keep=keep)
        except BaseException:
            if self._phase is not None:
                os.close(self._phase)
            raise
        finally:
            log.close()
        try:
            self.send(plan_command(shard), timeout=START_TIMEOUT_S)
        except BaseException:
            self.kill()
            self.close()
            raise

    def phase(self) -> int:
        """The phase the process last marked (``shard_worker.DECODING`` ...); DECODING when it cannot say."""
        if self._phase is None:
            return DECODING
        try:
            return os.pread(self._phase, 1, 0)[0]
        except (OSError, IndexError):
            return DECODING

    def failure(self, rc: int | None) -> str:
        """Why the process ended: the last error its log shows, else its exit status or signal."""
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(self._log_start)
                cause = last_error(fh.read().decode(errors="replace"))
        except OSError:
            cause = None
        return cause or describe_exit(rc, "shard process")

    def close(self) -> None:
        super().close()
        if self._phase is not None:
            os.close(self._phase)
            self._phase = None


class _Progress:
    """A small JSON file per shard, replaced atomically, that the job's bar polls.

    Replaced without fsync: it is only a display (a machine crash loses
    nothing a rerun needs), and the supervisor sends its shard process the
    next video only after writing it. With an fsync per write, each one
    waited on the journal behind the shards' own data: 1.4 s of 204 writes in
    a 200-video job on the 2-core VM (one took 210 ms), time the shard
    processes sat idle.
    """

    def __init__(self, out: str, index: int, total: int) -> None:
        self.path = os.path.join(out, PROGRESS_DIR, shard_name(index) + ".json")
        with storing("creating", os.path.dirname(self.path)):
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
        self.state = {"total": total, "done": 0, "new": 0, "clips": 0, "frames": 0}
        self._last = 0.0

    def set(self, done: int, records: Iterable[dict]) -> None:
        """Start again from what a (restarted) shard process holds: ``done`` videos, this run's ``records``."""
        records = list(records)
        self.state.update(done=done, new=len(records), clips=sum(r.get("clips", 0) for r in records),
                          frames=sum(r.get("frames", 0) for r in records))

    def add(self, record: dict | None = None, force: bool = False) -> None:
        if record is not None:
            self.state["done"] += 1
            self.state["new"] += 1
            self.state["clips"] += record.get("clips", 0)
            self.state["frames"] += record.get("frames", 0)
        now = time.monotonic()
        if force or now - self._last > 0.25:
            tmp = f"{self.path}.tmp"
            with storing("writing", tmp):
                with open(tmp, "w") as fh:
                    json.dump(self.state, fh)
                os.replace(tmp, self.path)
            self._last = now


def decoder_crash(rc: int | None, phase: int) -> bool:
    """Whether a shard process that ended with ``rc`` in ``phase`` died of the video it was decoding.

    Only a signal death while decoding is (FFmpeg's SIGSEGV, the OOM
    killer's SIGKILL, a SIGABRT); a Python exception escaping the process
    (status 1, its traceback in the log) is this package's or the machine's,
    and a signal that stops jobs from outside (SIGINT, SIGTERM, SIGHUP) says
    nothing about the video.
    """
    return rc is not None and rc < 0 and -rc not in STOP_SIGNALS and phase == DECODING

# --video-timeout is the decoder's budget: the seconds a shard process may spend on a video outside its decoder
# (reading the command, storing the clips) are counted apart, against this much (or the timeout, when longer),
# so that a small timeout fails slow videos, never blames the store for the time a process takes to wake up.
STORE_GRACE_S = 120.0
_READ_SLICE_S = 0.25


class VideoTimeout(TimeoutError):
    """No answer for a video: its decoder used up ``--video-timeout`` (``phase`` DECODING), or the process spent
    the store's grace outside its decoder (``phase`` the one it was in)."""

    def __init__(self, phase: int) -> None:
        super().__init__(phase)
        self.phase = phase


def read_video_answer(child: _Child, timeout: float) -> dict | None:
    """The shard process's answer for one video (``child.read``), timing its decoder alone against ``timeout``."""
    decoding = other = 0.0
    grace = max(STORE_GRACE_S, timeout)
    while True:
        start = time.monotonic()
        try:
            return child.read(min(_READ_SLICE_S, timeout))
        except TimeoutError:
            spent = time.monotonic() - start
            phase = child.phase()
            if phase == DECODING:
                decoding += spent
            else:
                other += spent
            if decoding >= timeout:
                raise VideoTimeout(DECODING) from None
            if other >= grace:
                raise VideoTimeout(phase) from None


def run_shard(out: str, shard: ShardPlan, opts: ShardOptions, retry: Sequence[int] = ()) -> dict:
    """Convert every pending video of ``shard``; returns the shard summary.

    The caller passes the shard's part of the plan, which goes down to each
    shard process this starts: neither this supervisor (on a Dask worker,
    say) nor its shard processes parse the whole plan. ``retry``: indices of
    videos to convert again although the shard has a record of them (their
    record, recorded as failed, is dropped just before the new attempt). The
    summary adds ``new_videos`` and ``new_clips``: what this run converted.

    A failure of the machine on this side (the shard's log or progress file
    cannot be written, no process can be started) is a ``ShardMachineFailed`` too.
    """
    try:
        return _run_shard(out, shard, opts, retry)
    except StoreError as exc:
        raise _machine_failed(out, shard.index, str(exc)) from None


def _machine_failed(out: str, index: int, cause: str, video: str | None = None) -> ShardMachineFailed:
    what = f"nothing was recorded for {video}; " if video else ""
    return ShardMachineFailed(f"{shard_name(index)}: {cause}; {what}free space on {out}'s device (or fix it) and "
                              f"run the same command again: it goes on where this run stopped")


def _run_shard(out: str, shard: ShardPlan, opts: ShardOptions, retry: Sequence[int]) -> dict:
    index, n_items = shard.index, len(shard.items)
    progress = _Progress(out, index, n_items)
    attempts: dict[int, int] = {}

    def fail(child: _Child, while_: str) -> ShardFailed | Stopped:
        rc = child.reap()
        machine = machine_cause(out, rc)
        child.close()
        if machine:
            return stop_for_machine(machine)
        if rc is not None and -rc in STOP_SIGNALS:
            return Stopped(-rc)
        return ShardFailed(f"{shard_name(index)}: shard process died while {while_}: {child.failure(rc)}; "
                           f"see {child.log_path}")

    def stop_for_machine(cause: str, video: str | None = None) -> ShardMachineFailed:
        return _machine_failed(out, index, cause, video)

    def checked(child: _Child, reply: dict | None) -> dict | None:
        if reply is not None and "machine" in reply:
            child.reap()
            child.close()
            raise stop_for_machine(reply["machine"], reply.get("video"))
        return reply

    def no_start(log_path: str) -> ShardFailed:
        return ShardFailed(f"{shard_name(index)}: shard process gave no sign of starting within "
                           f"{START_TIMEOUT_S:g}s (it hangs?); see {log_path}")

    def start() -> tuple[_Child, dict]:
        try:
            child = _Child(out, shard, opts)
        except StoreError:
            raise
        except TimeoutError:
            raise no_start(shard_log(out, index)) from None
        except OSError as exc:  # no pipe, no process: out of descriptors or memory
            raise stop_for_machine(f"cannot start the shard process ({exc.strerror or exc})") from None
        try:
            hello = checked(child, child.read(timeout=START_TIMEOUT_S))
        except TimeoutError:
            child.kill()
            child.close()
            raise no_start(child.log_path) from None
        if hello is None:
            raise fail(child, "starting")
        return child, hello

    child, hello = start()
    note = hello.get("note")
    again = set(retry)  # retried videos whose new record has not come back yet
    converted: dict[int, dict] = {}  # this run's records, by plan index

    def pending_after(hello: dict) -> list[int]:
        # What the (new) shard process holds decides what is left: a backend that
        # commits several videos at once (TFRecord parts) loses the uncommitted
        # ones with a crashed process, and they must be converted again.
        done = set(hello["done"]) - again
        for k in [k for k in converted if k not in done]:
            del converted[k]
        progress.set(len(done), converted.values())
        return [k for k in range(n_items) if k not in done]

    reasons: dict[int, str] = {}
    pending, pos = pending_after(hello), 0
    while pos < len(pending):
        i = pending[pos]
        if attempts.get(i, 0) > opts.retries:
            # Out of attempts: record the failure (again, if a later crash lost the uncommitted record).
            child.send({"op": "fail", "index": i, "reason": f"{reasons[i]}; {attempts[i]} attempts"})
            reply = checked(child, child.read(timeout=120))
            if reply is None:
                raise fail(child, "recording a failed video")
            again.discard(i)
            converted[i] = reply
            progress.add(reply)
            pos += 1
            continue
        child.send({"op": "retry" if i in again else "video", "index": i})
        video = f"video number {i} of the shard's plan"
        try:
            reply = checked(child, read_video_answer(child, opts.video_timeout))
            if reply is None:
                rc = child.reap()
                machine = machine_cause(out, rc)
                if machine:
                    child.close()
                    raise stop_for_machine(machine, video)
                if rc is not None and -rc in STOP_SIGNALS:
                    # Stopped from outside (a SIGTERM to the job's process group): the job stops too.
                    child.close()
                    raise Stopped(-rc)
                if not decoder_crash(rc, child.phase()):
                    # No evidence against the video: stop, record nothing, let a rerun redo it.
                    child.close()
                    raise ShardFailed(f"{shard_name(index)}: shard process died while converting {video}, "
                                      f"not in its decoder: {child.failure(rc)}; nothing was recorded for it; "
                                      f"see {child.log_path}")
                reasons[i] = describe_exit(rc)
        except VideoTimeout as timeout:
            child.kill()
            if timeout.phase != DECODING:
                child.close()
                raise ShardFailed(f"{shard_name(index)}: shard process gave no result for {video} within "
                                  f"{max(STORE_GRACE_S, opts.video_timeout):g}s outside its decoder (storing it: "
                                  f"the store hangs?); nothing was recorded for it; see {child.log_path}") from None
            reply, reasons[i] = None, f"no result within the {opts.video_timeout:g}s per-video timeout (hang?)"
        if reply is not None:
            again.discard(i)
            converted[i] = reply
            progress.add(reply)
            pos += 1
            continue
        child.close()
        attempts[i] = attempts.get(i, 0) + 1
        child, hello = start()
        pending, pos = pending_after(hello), 0
    child.send({"op": "finish"})
    summary = checked(child, child.read(timeout=None))
    if summary is None:
        raise fail(child, "finishing")
    child.close()
    child.proc.wait()
    progress.add(force=True)
    summary.pop("finished", None)
    return {"index": index, **summary, "new_videos": len(converted),
            "new_clips": sum(r.get("clips", 0) for r in converted.values()),
            **({"note": note} if note else {})}
