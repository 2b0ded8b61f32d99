"""The output folder: refuse one that holds something else, and hold its lock while a job writes it."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator

from ..format import FORMAT_NAME, LOCK, MANIFEST, PLAN, FormatError
from ..format.errors import store_error, storing
from ..format.layout import read_json_file
from ..worker.plan import ConvertConfig, PlanError, another_out


def check_out(out: str, config: ConvertConfig, *, staging_of: str | None = None) -> None:
    """Refuse an OUT that holds something else, before any work; ``staging_of``: the URL whose staging folder
    ``out`` is, for the advice (``plan.another_out``)."""
    another = another_out(staging_of)
    if not os.path.exists(out):
        return
    if not os.path.isdir(out):
        raise PlanError(f"{out}: exists and is not a directory")
    manifest = os.path.join(out, MANIFEST)
    if os.path.lexists(manifest):
        try:
            m = read_json_file(manifest, "manifest")
        except FormatError as exc:
            raise PlanError(str(exc)) from None
        if not isinstance(m, dict) or m.get("format") != FORMAT_NAME:
            got = m.get("format") if isinstance(m, dict) else type(m).__name__
            raise PlanError(f"{out}: holds a {got!r} dataset, not {FORMAT_NAME}; use {another}")
        if m.get("backend") != config.backend:
            raise PlanError(f"{out}: holds {m.get('backend')} shards, asked for {config.backend}; use {another}")
    elif not os.path.exists(os.path.join(out, PLAN)) and not os.path.exists(os.path.join(out, LOCK)) \
            and os.listdir(out):
        # A lock file without a plan: a job that started here and has not written its plan yet.
        folder = "an empty or new " + ("folder" if staging_of is None else f"--staging folder for {staging_of}")
        raise PlanError(f"{out}: not empty and holds no conversion; use {folder}")


def _holder(path: str) -> str:
    """Who holds the lock, as its JSON says; the holder may be a moment away from writing it."""
    for _ in range(20):
        with contextlib.suppress(OSError, ValueError), open(path) as fh:
            who = json.load(fh)
            return f"host {who['host']}, pid {who['pid']}, since {who['started']}"
        time.sleep(0.1)
    return "holder unknown"


def _lock(out: str, path: str, staging_of: str | None = None) -> int:
    """A descriptor of OUT's lock file holding its exclusive flock, or PlanError naming the holder.

    A job that created OUT and failed before writing anything removes OUT,
    lock file included (``_remove_if_empty``). A job that opened the lock file
    just before that would hold a lock on a file no one else sees; so once
    locked, the path must still name the locked file, or it is opened again.
    """
    while True:
        with storing("creating", out):
            os.makedirs(out, exist_ok=True)
        with storing("opening the lock file", path):
            fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise PlanError(f"{out}: another conversion is writing it ({_holder(path)}); "
                            f"wait for it to end, or use {another_out(staging_of)}") from None
        except OSError as exc:
            os.close(fd)
            raise store_error(exc, "locking", path) from None
        try:
            if os.path.samestat(os.fstat(fd), os.stat(path)):
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)


def _remove_if_empty(out: str) -> None:
    """Remove OUT when it holds nothing but its lock file and empty folders (what a job creates first)."""
    for dirpath, _, filenames in os.walk(out):
        if [n for n in filenames if not (dirpath == out and n == LOCK)]:
            return
    with contextlib.suppress(OSError):  # best effort: the job's own error is what the user must see
        os.remove(os.path.join(out, LOCK))
        for dirpath, _, _ in sorted(os.walk(out), key=lambda w: -len(w[0])):
            os.rmdir(dirpath)


@contextlib.contextmanager
def hold_out(out: str, *, staging_of: str | None = None) -> Iterator[None]:
    """Hold OUT's exclusive lock for the job's lifetime, or raise PlanError naming the holder.

    flock belongs to the open file, so the kernel releases it when the holding
    process dies however it dies (kill -9 included): a stale lock file is simply
    taken over by the next job. The lock file is deleted only with OUT itself:
    when this job created OUT and fails before writing anything into it, it
    leaves no empty OUT behind (still holding the lock while it removes it).
    ``staging_of``: the URL whose staging folder ``out`` is, for the advice.
    """
    created = not os.path.lexists(out)
    path = os.path.join(out, LOCK)
    fd = _lock(out, path, staging_of)
    try:
        who = {"host": socket.gethostname(), "pid": os.getpid(),
               "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        with storing("writing the lock file", path):
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(who).encode(), 0)
        yield
    except BaseException:
        if created:
            _remove_if_empty(out)
        raise
    finally:
        os.close(fd)


__all__ = ["check_out", "hold_out"]
