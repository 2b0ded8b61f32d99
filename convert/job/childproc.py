"""A child process of this package that takes JSON commands on stdin and answers each with one JSON line.

The shard processes (``convert.worker.shard_worker``) and the space check's probe
process (``convert.worker.probe``) are both such children: forked from the fork
server where it runs (``convert.worker.forkserver``), else started the ordinary way,
watched through their answers with a timeout, killed when they hang.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import IO, cast

from ..signals import stop_signals_blocked
from ..worker import forkserver


class Stopped(Exception):
    """The job is being stopped by a signal (``stop_all``): nothing more is started, sent or recorded.

    ``signum``: the signal, when one of this package's children died of it.
    """

    def __init__(self, signum: int | None = None) -> None:
        super().__init__("stopped by a signal" if signum is None else f"a child process was stopped by signal "
                         f"{signum}")
        self.signum = signum


_stopping = threading.Event()


def stopping() -> bool:
    """Whether ``stop_all`` has run: every child is being killed, and what they answer no longer counts."""
    return _stopping.is_set()


def use_forkserver() -> bool:
    """CONVERT_FORKSERVER=0 starts every child afresh (to compare, or to rule the server out)."""
    return os.environ.get("CONVERT_FORKSERVER", "1") != "0" and forkserver.available()


class LineProcess:
    """``python -m MODULE ARGV`` with pipes for its commands and answers.

    ``argv`` is called with the numbers the descriptors ``keep`` will have in
    the child (the fork server numbers them from 3, ``pass_fds`` keeps them
    as they are), so the arguments can tell the child where they are.
    OSError when no process can be started (no descriptors or memory left).
    """

    def __init__(self, *, module: str, argv: Callable[[list[int]], list[str]], env: dict[str, str], stderr: int,
                 keep: Sequence[int] = ()) -> None:
        keep = tuple(keep)
        if _stopping.is_set():
            raise Stopped
        # Forked from a server that has imported everything already: a fork
        # instead of an interpreter's start-up per child (see convert.worker.forkserver).
        proc: forkserver.ForkedProcess | subprocess.Popen[bytes] | None = None
        if use_forkserver():
            proc = forkserver.spawn(argv(list(range(3, 3 + len(keep)))), env=env, stderr=stderr, keep=keep,
                                    module=module)
        if proc is None and _stopping.is_set():
            raise Stopped  # the server was ended by the stop: no child started the ordinary way either
        if proc is None:
            with stop_signals_blocked():  # until the child ignores SIGINT (its main)
                proc = subprocess.Popen([sys.executable, "-m", module, *argv(list(keep))], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=stderr, env=env, pass_fds=keep)
        self.proc: forkserver.ForkedProcess | subprocess.Popen[bytes] = proc
        # Both ways of starting it give the process pipes for stdin and stdout.
        self.stdin = cast(IO[bytes], self.proc.stdin)
        self.stdout = cast(IO[bytes], self.proc.stdout)
        self._buf = b""
        _live.add(self)
        if _stopping.is_set():  # stop_all ran while this one started: it may have missed it
            self.proc.kill()
            raise Stopped

    def send(self, obj: dict, timeout: float | None = None) -> None:
        """Write ``obj`` as one line. ``timeout``: the seconds the process has to take it, for a line longer than
        a pipe holds (TimeoutError when it has not; None: wait, for a command that fits the pipe)."""
        if _stopping.is_set():
            raise Stopped
        data = (json.dumps(obj) + "\n").encode()
        try:
            if timeout is None:
                self.stdin.write(data)
                self.stdin.flush()
            else:
                self._write_within(data, timeout)
        except BrokenPipeError:
            pass  # the process has died: the next read sees its end and asks why

    def _write_within(self, data: bytes, timeout: float) -> None:
        """Write ``data`` to the process's stdin within ``timeout`` seconds: a process that hangs before it reads
        must not hang its caller on a full pipe."""
        self.stdin.flush()
        fd = self.stdin.fileno()
        deadline = time.monotonic() + timeout
        left = memoryview(data)
        os.set_blocking(fd, False)
        try:
            while left:
                if not forkserver.writable(fd, deadline - time.monotonic()):
                    raise TimeoutError(f"the process took no input for {timeout:g}s")
                try:
                    left = left[os.write(fd, left):]
                except BlockingIOError:
                    continue  # the pipe filled between the poll and the write
        finally:
            os.set_blocking(fd, True)

    def read(self, timeout: float | None) -> dict | None:
        """The next answer; None when the process died; TimeoutError when it hangs.

        ``Stopped`` instead of any of them once ``stop_all`` has run: the
        process may have died of it, which says nothing about its work.
        """
        fd = self.stdout.fileno()
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buf:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready = forkserver.readable(fd, wait)
            if _stopping.is_set():
                raise Stopped
            if not ready:
                raise TimeoutError
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                if _stopping.is_set():
                    raise Stopped
                return None
            self._buf += chunk
        if _stopping.is_set():
            raise Stopped
        line, self._buf = self._buf.split(b"\n", 1)
        message: dict = json.loads(line)  # the shard process writes one JSON object a line
        return message

    def kill(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.kill()
        return self.proc.wait()

    def reap(self, grace: float = 10.0) -> int | None:
        """Exit status of a process whose pipe has closed: it may still be exiting.

        Killing it at once would report our own SIGKILL (and "out of memory?")
        for a process that was ending with an error of its own.
        """
        try:
            return self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            return self.kill()

    def close(self) -> None:
        _live.discard(self)
        for stream in (self.stdin, self.stdout):
            try:
                stream.close()
            except OSError:
                pass


_live: set[LineProcess] = set()  # started and not closed yet


def stop_all(wait: float) -> None:
    """Stop every child of this process for good: the job is being stopped (``convert.cli``'s signal handling).

    From now on no child starts and no answer counts (``Stopped``); each
    running child is killed, then waited for, ``wait`` seconds in all. Safe
    for the data at any moment: a shard process commits each video
    atomically, so a killed one leaves the video for a rerun, as kill -9 does.
    """
    _stopping.set()
    children = list(_live)
    for child in children:
        try:
            child.proc.kill()
        except OSError:
            pass  # already gone
    deadline = time.monotonic() + wait
    for child in children:
        try:
            child.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except (subprocess.TimeoutExpired, OSError):
            pass  # killed: it ends, reaped by whoever waits for it next


__all__ = ["LineProcess", "Stopped", "stop_all", "stopping", "use_forkserver"]
