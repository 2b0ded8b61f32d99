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
        try:
            free = f"{shutil.disk_usage(os.path.dirname(path) or '.').free} bytes"
        except OSError:
            free = "no"
        return StoreFullError(exc.errno, f"no space left for {path}: {what} failed ({exc.strerror}); "
                                         f"the device has {free} free")
    return StoreError(exc.errno, f"{what} {path} failed: {exc.strerror or exc}")


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


__all__ = ["FormatError", "ShardDamaged", "ShardMissing", "StoreError", "StoreFullError", "store_error", "storing"]
