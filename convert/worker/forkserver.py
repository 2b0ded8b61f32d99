"""Start shard processes by forking a warm server instead of starting Python afresh.

A shard process needs numpy, PyAV, lmdb and this package: a start of the
interpreter and its imports, paid again for every shard, which was a large
share of all the CPU time a small conversion used (docs/benchmarks.md,
figures quoted in code comments). The fork server is one
``python -m convert.worker.forkserver`` per job process that imports all of that
once, then forks a child per shard (a few milliseconds); the child runs
``convert.worker.shard_worker.main`` (or the space check's ``convert.worker.probe.main``) as
``python -m convert.worker.shard_worker`` would, with the given pipes as stdin and
stdout, the shard's log as stderr, the caller's environment and working
directory, and SIGINT ignored (the job stops its children itself).

The server is the children's parent, so it reaps them and sends each exit
status (negative for a signal, as ``subprocess`` reports it) down a pipe the
caller handed over; ``ForkedProcess`` reads it and offers the part of
``subprocess.Popen`` the supervisor uses. The server is single-threaded when
it forks (OpenBLAS is kept to one thread, nothing else starts threads), and
it exits when the process that started it closes its socket, however that
process ends.

Anything the server cannot do (it failed to start, died, or the platform has
no ``fork``/``SCM_RIGHTS``) makes ``spawn`` return None, and the caller starts
the shard process the ordinary way.
"""

from __future__ import annotations

import atexit
import fcntl
import json
import logging
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import traceback
from typing import IO

from ..signals import STOP_SIGNALS, stop_signals_blocked, unblock_stop_signals

log = logging.getLogger(__name__)

_STATUS = struct.Struct("<i")
_MAX_MESSAGE = 1 << 20
# The modules a child may run, as ``python -m MODULE ARGV`` would (their ``main(argv)``).
MODULES = ("convert.worker.shard_worker", "convert.worker.probe")
MAX_KEEP = 4  # descriptors a child may be given beside its standard streams


def readable(fd: int, timeout: float | None) -> bool:
    """Whether ``fd`` has data (or its end) within ``timeout`` seconds (None: wait).

    ``poll``, not ``select``: a job process may hold more than 1024 descriptors
    (a thousand shard pipes, or a library that opened many), and ``select``
    fails on any descriptor numbered 1024 or more.
    """
    return _ready(fd, select.POLLIN, timeout)


def writable(fd: int, timeout: float | None) -> bool:
    """Whether ``fd`` takes data (or its reader has gone) within ``timeout`` seconds (None: wait); ``poll``, as
    ``readable``."""
    return _ready(fd, select.POLLOUT, timeout)


def _ready(fd: int, events: int, timeout: float | None) -> bool:
    poller = select.poll()
    poller.register(fd, events | select.POLLHUP | select.POLLERR)
    return bool(poller.poll(None if timeout is None else max(0.0, timeout) * 1000))


# -- the caller's side ----------------------------------------------------------
class ForkedProcess:
    """A child of the fork server, with the part of ``subprocess.Popen``'s interface the supervisor uses."""

    def __init__(self, pid: int, stdin: IO[bytes], stdout: IO[bytes], status_fd: int, args: list[str]) -> None:
        self.pid = pid
        self.args = args
        self.stdin = stdin
        self.stdout = stdout
        self.returncode: int | None = None
        self._status_fd = status_fd
        # The supervisor and the job's stop (``childproc.stop_all``) may wait at once: one reads the
        # status and closes its pipe, the other must not read the closed (or reused) descriptor.
        self._lock = threading.Lock()
        # Held while the pidfd is used or closed: kill() from one thread must not send to a descriptor
        # that another thread's wait has closed (and that may name another process by then). Reentrant:
        # the job's stop runs in a signal handler that may have interrupted a kill() in the main thread.
        self._pidfd_lock = threading.RLock()
        _running.add(pid)
        try:
            # A pidfd names this very process even after its pid is reused: kill() never hits another one.
            self._pidfd: int | None = os.pidfd_open(pid)
        except (AttributeError, OSError):
            self._pidfd = None

    def _collect(self, timeout: float | None) -> int | None:
        if self.returncode is not None:
            return self.returncode
        if not self._lock.acquire(timeout=-1 if timeout is None else max(0.0, timeout)):
            return None
        try:
            return self._collect_locked(timeout)
        finally:
            self._lock.release()

    def _collect_locked(self, timeout: float | None) -> int | None:
        if self.returncode is not None:
            return self.returncode
        if not readable(self._status_fd, timeout):
            return None
        data = os.read(self._status_fd, _STATUS.size)
        if len(data) == _STATUS.size:
            self.returncode = _STATUS.unpack(data)[0]
        else:
            # The server died before the child: its status is lost. Make sure the
            # child is gone too, and say "exited with status 255" rather than guess.
            if not _closing:  # else the job is being stopped: it ended the server itself
                log.warning("fork server lost before shard process %d ended; its exit status is unknown", self.pid)
            self._signal(signal.SIGKILL)
            self.returncode = 255
        os.close(self._status_fd)
        _running.discard(self.pid)
        with self._pidfd_lock:
            pidfd, self._pidfd = self._pidfd, None
            if pidfd is not None:
                os.close(pidfd)
        return self.returncode

    def poll(self) -> int | None:
        return self._collect(0)

    def wait(self, timeout: float | None = None) -> int:
        rc = self._collect(timeout)
        if rc is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return rc

    def _signal(self, sig: int) -> None:
        with self._pidfd_lock:
            if self.returncode is not None:
                return  # its status has come back (it was reaped): its pid may be another process's by now
            try:
                if self._pidfd is not None:
                    signal.pidfd_send_signal(self._pidfd, sig)
                else:
                    os.kill(self.pid, sig)
            except ProcessLookupError:
                pass  # already gone: its status is on the way

    def kill(self) -> None:
        if self.returncode is None:
            self._signal(signal.SIGKILL)


class _Server:
    """The running fork server and the socket to it (one per process, shared by the supervisor threads)."""

    def __init__(self, env: dict[str, str]) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = dict(env)
        env.setdefault("OPENBLAS_NUM_THREADS", "1")  # numpy's BLAS pool would be a thread at fork time
        with stop_signals_blocked():
            self.proc = subprocess.Popen([sys.executable, "-m", "convert.worker.forkserver", str(theirs.fileno())],
                                         pass_fds=[theirs.fileno()], env=env, cwd="/", stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL)
        theirs.close()
        # A server that does not answer within this long is killed and the shard
        # process started the ordinary way (killed first, so it cannot fork late).
        ours.settimeout(120)
        self.sock = ours
        self.lock = threading.Lock()

    def spawn(self, module: str, argv: list[str], env: dict[str, str], cwd: str, fds: list[int]) -> int:
        """Ask for a child; its pid. OSError when the server is gone or refuses."""
        message = json.dumps({"module": module, "argv": argv, "env": env, "cwd": cwd, "fds": len(fds)}).encode()
        if len(message) > _MAX_MESSAGE:
            raise OSError(f"request of {len(message)} bytes is too large for the fork server")
        with self.lock:
            socket.send_fds(self.sock, [message], fds)
            reply = self.sock.recv(4096)
        if not reply:
            raise OSError("fork server closed its socket")
        answer = json.loads(reply)
        if "pid" not in answer:
            raise OSError(f"fork server: {answer.get('error')}")
        return int(answer["pid"])

    def close(self) -> None:
        self.sock.close()


_server: _Server | None = None
_server_failed = False
_closing = False  # shutdown() ran: the job is being stopped, no server is started or used again
_server_lock = threading.Lock()
_running: set[int] = set()  # pids of children whose exit status has not come back yet


def _forget_after_fork() -> None:
    """A forked copy of this process must not talk to (or keep alive) its parent's server."""
    global _server, _server_lock
    _server_lock = threading.Lock()
    _running.clear()
    if _server is not None:
        _server.sock.close()
    _server = None


def stop() -> None:
    """Close the server's socket; wait for it to end (at once) unless shard processes of ours still run.

    Runs at exit. A job that stops on one shard's error leaves the others'
    processes running: the server outlives this process until they have
    ended (they see their stdin close and exit, as before the server), and
    is not waited for. A later ``spawn`` starts a new server.
    """
    global _server
    with _server_lock:
        server, _server = _server, None
    if server is None:
        return
    server.close()
    if _running:
        return
    try:
        server.proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        server.proc.wait()


def shutdown(wait: float) -> None:
    """End the server now, the job being stopped (its children killed already): at most ``wait`` seconds.

    Takes no lock (it runs in a signal handler, which may have interrupted a
    holder of one): closes the socket, lets the server reap what is left and
    exit, and kills it if it has not within ``wait``.
    """
    global _closing
    _closing = True
    server = _server
    if server is None:
        return
    try:
        server.close()
        server.proc.wait(timeout=wait)
    except subprocess.TimeoutExpired:
        server.proc.kill()
    except OSError:
        pass  # already gone


_hooks_installed = False


def _install_hooks() -> None:
    """When the first server starts (never at import): stop it at exit, and forget it in forked children."""
    global _hooks_installed
    if _hooks_installed:
        return
    _hooks_installed = True
    atexit.register(stop)
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_forget_after_fork)


def available() -> bool:
    return hasattr(os, "fork") and hasattr(socket, "send_fds") and sys.platform.startswith("linux")


def prestart(env: dict[str, str]) -> None:
    """Start the server now (it imports while the caller plans); later ``spawn`` calls reuse it."""
    _get(env)


def _discard(server: _Server) -> None:
    """Kill a server that failed a request; the next ``spawn`` starts a new one."""
    global _server
    server.proc.kill()
    server.proc.wait()
    server.close()
    with _server_lock:
        if _server is server:
            _server = None


def _get(env: dict[str, str]) -> _Server | None:
    global _server, _server_failed
    if not available() or _server_failed or _closing:
        return None
    with _server_lock:
        if _server is not None and _server.proc.poll() is not None:
            log.warning("fork server exited with status %s; starting another", _server.proc.returncode)
            _server.close()
            _server = None
        if _server is None:
            _install_hooks()
            try:
                _server = _Server(env)
            except OSError as exc:
                log.warning("cannot start the fork server (%s); shard processes start the ordinary way", exc)
                _server_failed = True
        return _server


def spawn(argv: list[str], *, env: dict[str, str], stderr: int, keep: tuple[int, ...] = (),
          module: str = MODULES[0]) -> ForkedProcess | None:
    """``python -m MODULE ARGV`` as a child of the fork server; None when that cannot be done.

    Its stdin and stdout are new pipes (``.stdin``, ``.stdout``), its stderr
    the descriptor ``stderr``; the descriptors ``keep`` are its 3, 4, ... (as
    ``pass_fds`` would keep them, but numbered from 3); it sees ``env`` as its
    environment and this process's working directory as its own. OSError when
    no pipe can be made (the process is out of descriptors).
    """
    if module not in MODULES or len(keep) > MAX_KEEP:
        raise ValueError(f"the fork server runs {', '.join(MODULES)} with at most {MAX_KEEP} kept descriptors")
    server = _get(env)
    if server is None:
        return None
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    status_r, status_w = os.pipe()
    try:
        pid = server.spawn(module, argv, env, os.getcwd(), [in_r, out_w, stderr, status_w, *keep])
    except OSError as exc:
        for fd in (in_r, in_w, out_r, out_w, status_r, status_w):
            os.close(fd)
        if _closing:
            return None  # the job is being stopped and closed the socket under this request
        log.warning("fork server failed (%s); starting the shard process the ordinary way", exc)
        _discard(server)
        return None
    for fd in (in_r, out_w, status_w):
        os.close(fd)
    return ForkedProcess(pid, os.fdopen(in_w, "wb"), os.fdopen(out_r, "rb"), status_r,
                         [sys.executable, "-m", module, *argv])


# -- the server's side ----------------------------------------------------------
def _exit_code(status: int) -> int:
    return os.waitstatus_to_exitcode(status)


def _run_child(module: str, argv: list[str]) -> int:
    """What ``python -m MODULE ARGV`` does, in this forked process; its exit status."""
    import importlib

    main = importlib.import_module(module).main
    sys.argv = [module, *argv]
    try:
        return main(argv) or 0
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    except BaseException:  # noqa: BLE001 - the interpreter's own policy: print the traceback, exit 1
        traceback.print_exc()
        return 1


# Whether the fork server was started ignoring SIGHUP (nohup), for its children (``serve``, ``_child``).
_hangup_ignored = False


def _child(fds: list[int], request: dict, close: list[int]) -> None:
    stdin_fd, stdout_fd, stderr_fd, status_fd, *keep = fds
    for fd in [status_fd, *close]:
        os.close(fd)
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    # Ctrl-C reaches the whole process group, children too: the job stops them itself (it kills them), so
    # they ignore it rather than print a KeyboardInterrupt each. SIGTERM ends them quietly, as it would, and so
    # does a closed terminal's SIGHUP, unless the job was started ignoring it (nohup), as the server was.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_IGN if _hangup_ignored else signal.SIG_DFL)
    for fd, target in ((stdin_fd, 0), (stdout_fd, 1), (stderr_fd, 2)):
        os.dup2(fd, target)
    for fd in {stdin_fd, stdout_fd, stderr_fd} - {0, 1, 2}:
        os.close(fd)
    # The kept descriptors become 3, 4, ...: first moved above that range, so that none is
    # overwritten by another's move.
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 3 + len(keep)) for fd in keep]
    for fd in keep:
        os.close(fd)
    for i, fd in enumerate(high):
        os.dup2(fd, 3 + i)
        os.close(fd)
    sys.stdin = open(0, closefd=False)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, errors="backslashreplace", closefd=False)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    rc = _run_child(request["module"], request["argv"])
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except OSError:
            pass
    os._exit(rc & 0xFF if rc >= 0 else 1)


def serve(fd: int) -> int:
    """The server's loop: fork a child per request on socket ``fd``; return when the socket closes."""
    # The imports every child would otherwise repeat (PyAV too: convert.worker.decode imports it on first use).
    import av  # noqa: F401

    import convert.worker.probe  # noqa: F401
    import convert.worker.shard_worker  # noqa: F401

    # Ctrl-C or a SIGTERM to the job's process group is for the job, which stops its children and then
    # this server; the server always ends with the job (its socket closes), and only once it has reported
    # every child's exit status.
    global _hangup_ignored
    _hangup_ignored = signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    for sig in STOP_SIGNALS:  # a closed terminal's SIGHUP too
        signal.signal(sig, signal.SIG_IGN)
    unblock_stop_signals()  # blocked since it started (stop_signals_blocked): ignored from now on
    sock = socket.socket(fileno=fd)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    status: dict[int, int] = {}  # child pid -> the write end of its status pipe

    def reap() -> None:
        while status:
            try:
                pid, st = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            fd_ = status.pop(pid, None)
            if fd_ is not None:
                try:
                    os.write(fd_, _STATUS.pack(_exit_code(st)))
                except OSError:
                    pass  # the caller has gone
                os.close(fd_)

    accepting = True
    # poll, as ``readable``: the status pipes of a thousand children may number past select's 1024.
    poller = select.poll()
    for fd_ in (sock.fileno(), wake_r):
        poller.register(fd_, select.POLLIN)
    while accepting or status:
        # Once the job has closed its socket, the children it left running (a
        # job that stopped on one shard's error) still end as they would have
        # as its own: they see their stdin close, finish, and are reaped here.
        ready = {fd_ for fd_, _ in poller.poll()}
        if wake_r in ready:
            os.read(wake_r, 4096)
            reap()
        if sock.fileno() not in ready:
            continue
        try:
            message, fds, _, _ = socket.recv_fds(sock, _MAX_MESSAGE, 4 + MAX_KEEP)
        except ConnectionResetError:
            message, fds = b"", []
        if not message:
            for fd_ in fds:
                os.close(fd_)
            accepting = False
            poller.unregister(sock.fileno())
            continue
        try:
            request = json.loads(message)
            if len(fds) != request.get("fds") or len(fds) < 4 or request.get("module") not in MODULES:
                raise ValueError(f"a request for {request.get('module')!r} with {len(fds)} descriptors")
            pid = os.fork()
        except (ValueError, OSError) as exc:
            for fd_ in fds:
                os.close(fd_)
            sock.send(json.dumps({"error": f"{type(exc).__name__}: {exc}"}).encode())
            continue
        if pid == 0:
            try:
                _child(fds, request, [sock.detach(), wake_r, wake_w, *status.values()])
            except BaseException:  # noqa: BLE001 - setting up the child failed: say why, in its log
                traceback.print_exc()
            os._exit(1)
        for fd_ in fds[:3] + fds[4:]:
            os.close(fd_)
        status[pid] = fds[3]
        sock.send(json.dumps({"pid": pid}).encode())
        reap()  # a child may already have ended
    return 0


if __name__ == "__main__":
    # Straight out, without the interpreter's teardown of numpy and PyAV
    # (tens of ms the job would wait for at its own exit).
    os._exit(serve(int(sys.argv[1])))
