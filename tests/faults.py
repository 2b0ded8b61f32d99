"""Faults injected into real shard processes: the suite's ``CONVERT_SHARD_HOOK``.

``tests/conftest.py`` sets ``CONVERT_SHARD_HOOK=tests.faults:install`` for
the whole session; every shard process calls ``install()`` once as it
starts, and a test chooses the fault with ``CONVERT_TEST_FAULT``:

- ``"crash:ID"``, ``"hang:ID"``, ``"alloc:ID"``, ``"enospc:ID"``,
  ``"crash_once:ID:MARKER_FILE"``, ``"raise:ID"``: the fault strikes in the
  decode step of the video ``ID`` (a SIGSEGV, a sleep, a 1 TiB allocation, a
  full store, one SIGSEGV, a Python exception), so the suite proves that a
  decoder crash or hang costs one video and nothing else, without shipping a
  file that really crashes FFmpeg;
- ``"crash_storing:ID"``: a SIGSEGV once the writer holds the video's first
  clip (storing it, not decoding);
- ``"hang_probe:ID"``: the space check's probe process (``convert.worker.probe``,
  which installs the same hook) sleeps on the video ``ID``, as on a file
  whose open never returns;
- ``"eio:NAME:COUNT:MARKER_FILE"``: the first ``COUNT`` writes (over every
  shard process, counted in ``MARKER_FILE``) into a file whose name contains
  ``NAME`` fail with EIO, as the kernel's ``write`` reports it (no file
  named); a write of the LMDB backend's space reservation (``fallocate``)
  counts as a write into ``data.mdb``.
"""

from __future__ import annotations

import builtins
import errno
import os
import signal
import time

from convert.format import StoreFullError
from convert.worker import shard_worker

FAULT_ENV = "CONVERT_TEST_FAULT"


def _strike(kind: str, marker: str, video_id: str) -> None:
    if kind == "crash" or (kind == "crash_once" and not os.path.exists(marker)):
        if marker:
            open(marker, "w").close()
        os.kill(os.getpid(), signal.SIGSEGV)
    if kind == "hang":
        time.sleep(3600)
    if kind == "alloc":
        import numpy as np

        np.ones(1 << 40, dtype=np.uint8)  # 1 TiB: fails under any --max-memory
    if kind == "enospc":  # the store fills up in the middle of this video's clips
        raise StoreFullError(errno.ENOSPC, f"no space left for the shard (simulated while writing {video_id})")
    if kind == "raise":  # a bug of the package in the decode step: a Python exception escapes the process
        raise RuntimeError(f"injected fault while converting {video_id}")


def _eio() -> OSError:
    return OSError(errno.EIO, os.strerror(errno.EIO))


class _Budget:
    """How many more writes may fail: ``count`` over every process, counted in the marker file."""

    def __init__(self, count: int, marker: str) -> None:
        self.count, self.marker = count, marker

    def take(self) -> bool:
        # os-level, not open(): that is the function the fault wraps
        fd = os.open(self.marker, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            if os.fstat(fd).st_size >= self.count:
                return False
            os.write(fd, b"x")
            return True
        finally:
            os.close(fd)


class _FailingFile:
    """A file opened for writing whose writes fail with EIO while the budget lasts; all else is the file's."""

    def __init__(self, fh, budget: _Budget) -> None:
        self._fh, self._budget = fh, budget

    def write(self, data):
        if self._budget.take():
            raise _eio()
        return self._fh.write(data)

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def __getattr__(self, name):
        return getattr(self._fh, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self._fh.close()

    def __iter__(self):
        return iter(self._fh)


def _install_eio(name: str, budget: _Budget) -> None:
    real_open, real_fallocate = builtins.open, os.posix_fallocate

    def open_(file, mode="r", *args, **kwargs):
        fh = real_open(file, mode, *args, **kwargs)
        if isinstance(file, str) and name in os.path.basename(file) and any(c in mode for c in "wax+"):
            return _FailingFile(fh, budget)
        return fh

    def fallocate(fd, offset, length):
        if name in os.path.basename(os.readlink(f"/proc/self/fd/{fd}")) and budget.take():
            raise _eio()
        return real_fallocate(fd, offset, length)

    builtins.open = open_
    os.posix_fallocate = fallocate


def install() -> None:
    """Wrap the shard process's decode step (or its files) so that ``$CONVERT_TEST_FAULT``'s target meets its
    fault."""
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return
    kind, _, rest = spec.partition(":")
    if kind == "eio":
        name, count, marker = rest.split(":", 2)
        _install_eio(name, _Budget(int(count), marker))
        return
    target, _, marker = rest.partition(":")
    if kind == "hang_probe":
        from convert.worker import probe

        real_probe = probe.probe_video

        def probe_video(item, config):
            if item.id == target:
                time.sleep(3600)
            return real_probe(item, config)

        probe.probe_video = probe_video
        return
    if kind == "crash_storing":
        real_producer = shard_worker.clip_producer

        def clip_producer(item, config, threads, decoder=None):
            produce = real_producer(item, config, threads, decoder)
            if item.id != target:
                return produce

            def crashing():
                gen = produce()
                yield next(gen)  # the writer stores this clip, then asks for the next one
                os.kill(os.getpid(), signal.SIGSEGV)

            return crashing

        shard_worker.clip_producer = clip_producer
        return
    real = shard_worker.frames_of

    def frames_of(item, dec):
        if item.id == target:
            _strike(kind, marker, item.id)
        return real(item, dec)

    shard_worker.frames_of = frames_of
