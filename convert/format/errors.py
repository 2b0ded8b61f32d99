"""The format layer's error types: one per kind of failure.

Data that does not follow FORMAT.md is a ``FormatError`` (a ``ValueError``):
its message is one line naming the file, shard or clip and what is wrong. A
failure of the machine while writing (full disk, I/O error) is a
``StoreError`` (an ``OSError``): never a property of the video being written.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from collections.abc import Iterator


class FormatError(ValueError):
    """A stored value or file that does not follow FORMAT.md."""


class ShardMissing(FormatError):
    """A shard the manifest lists is not on disk (deleted, or OUT copied in part)."""


class ShardDamaged(FormatError):
    """A shard that cannot be opened for writing: its files are damaged (truncated, overwritten)."""


class StoreError(OSError):
    """The store failed to write (I/O error, damaged store): a problem of the machine, never of the video."""

    def __str__(self) -> str:
        return self.strerror or super().__str__()  # the message already says what; no "[Errno 28]" prefix


class StoreFullError(StoreError):
    """No room on the device for the next video."""


def store_error(exc: OSError, what: str, path: str) -> StoreError:
    """The machine error for ``exc`` raised while ``what`` (e.g. "writing shard") ``path``: one line naming both."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return StoreFullError(exc.errno, f"no space left for {path}: {what} failed ({exc.strerror}); "
                                         f"the device has {device_room(os.path.dirname(path) or '.')}")
    return StoreError(exc.errno, f"{what} {path} failed: {exc.strerror or exc}")


def device_room(folder: str) -> str:
    """What the device of ``folder`` has left, as the message of a full device says it.

    A device can be full of files rather than bytes (every inode used, as on a
    tmpfs with a small ``nr_inodes``): then it says so, rather than "N bytes free".
    """
    try:
        st = os.statvfs(folder)
    except OSError:
        return "no space free"
    free = f"{shutil.disk_usage(folder).free} bytes free"
    if st.f_files and not st.f_favail:
        return f"no free inodes (no room for another file) and {free}"
    return free


def machine_cause(exc: OSError, folder: str) -> str:
    """What ``exc``, raised while using ``folder``, says of the machine, in words for a one-line message.

    A full device says whether bytes or inodes ran out; a read-only file
    system, a folder of another user and a failing disk each say so, with
    what to do, rather than the bare ``[Errno N]``.
    """
    code = exc.errno
    if code in (errno.ENOSPC, errno.EDQUOT):
        return f"no space left ({exc.strerror}): the device has {device_room(folder)}"
    if code == errno.EROFS:
        return "its file system is read-only (remounted after an error?); give a writable folder"
    if code in (errno.EACCES, errno.EPERM):
        where = str(exc.filename or folder)
        owner = "not writable"
        probe = where
        while probe and probe != os.path.dirname(probe):  # the nearest folder this process can see
            try:
                owner = f"{probe} is owned by uid {os.stat(probe).st_uid}"
                break
            except OSError:
                probe = os.path.dirname(probe)
        return (f"permission denied on {where} ({owner}; this process runs as uid {os.getuid()}): give a folder "
                f"of this user's")
    if code == errno.EIO:
        return f"I/O error on {exc.filename or folder} (a failing disk?)"
    return f"{exc.strerror or exc}{f' ({exc.filename})' if exc.filename else ''}"


@contextlib.contextmanager
def storing(what: str, path: str) -> Iterator[None]:
    """Any OSError inside becomes the ``StoreError`` of ``store_error(exc, what, path)``.

    Every write, sync, rename, truncation and close a backend makes runs in
    one of these, so no failure of the machine escapes as a bare
    ``[Errno 5]`` or is taken for a property of the video being written.
    """
    try:
        yield
    except StoreError:
        raise
    except OSError as exc:
        raise store_error(exc, what, path) from None


def make_folder(path: str) -> None:
    """``os.makedirs(path, exist_ok=True)`` for a writer: a failure of the machine is its ``StoreError``.

    A file where the folder belongs (FileExistsError) is no failure of the
    machine but of what OUT holds: it stays the OSError it is, naming the path,
    and the process that meets it reports it as such.
    """
    try:
        os.makedirs(path, exist_ok=True)
    except FileExistsError:
        raise
    except OSError as exc:
        raise store_error(exc, "creating", path) from None


__all__ = ["FormatError", "ShardDamaged", "ShardMissing", "StoreError", "StoreFullError", "device_room",
           "machine_cause", "make_folder", "store_error", "storing"]
