"""The images' entry point: check what a service needs before anything is written, then run it.

    python docker/entrypoint.py convert ARGS...  ->  python -m convert ARGS
    python docker/entrypoint.py train ARGS...    ->  torchrun (rendezvous from the environment) -m train ARGS,
                                                     torchrun's own main run in this process (see launch)
    python docker/entrypoint.py check ARGS...    ->  python scripts/device_check.py --work /out/device_check ARGS

Why here and not in the programs: these are properties of the container (a
mount that is missing, read-only or owned by another user, a rendezvous that
names no master, GPUs that did not reach the container), which the programs
would report late (torchrun waits for a master that never comes) or as a
stack trace. Each refusal is one line on stderr and exit status 2, before the
service writes anything. The command then replaces this process (exec), so
the program is PID 1 and receives the engine's SIGTERM itself; torchrun runs
in this process instead (``launch``), for the same reason, so that a stopped
or failed trainer ends in one line rather than torchrun's traceback.

Environment (docker/docker-compose.yml passes these): NNODES, NODE_RANK,
MASTER_ADDR, MASTER_PORT, NPROC_PER_NODE (a count or ``gpu``: one process per
visible GPU) and GPUS (the GPUs reserved for the service: a count or ``all``).
The trainer runs on the CPU when its arguments say ``--device cpu``.
"""

from __future__ import annotations

import argparse
import errno
import ipaddress
import os
import socket
import stat
import sys
import tempfile
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import NoReturn

DATA = "/data"
OUT = "/out"
GPU_HOST = ("the host needs an NVIDIA driver of the 580 branch or newer and the NVIDIA Container Toolkit "
            "(docs/docker.md, GPU nodes); docker/compose.cpu.yml runs the service on the CPU")


class Refusal(Exception):
    """A precondition of the service that does not hold: one line for the user."""


def _user() -> str:
    return f"uid {os.getuid()} gid {os.getgid()}"


def _not_a_folder(mode: int) -> str:
    """What a path of this ``st_mode`` is, in words, for a mount that should have been a folder."""
    kinds = ((stat.S_ISREG, "a file"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))
    return next((what for test, what in kinds if test(mode)), f"not a folder (mode {stat.filemode(mode)})")


def _check_folder(name: str, path: str, missing: str) -> None:
    """The mount ``name`` at ``path`` is a folder, or a Refusal saying what is there instead.

    A bind mount of a file, a FIFO or a symlink that loops would otherwise
    reach ``os.listdir`` or ``mkstemp`` and end as an OSError traceback; the
    user needs to know what the engine mounted, not the call that failed.
    """
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        if os.path.islink(path):  # the mount is there, its target is not
            raise Refusal(f"{name} (mounted at {path}) is a symlink to a missing path, expected a folder") from None
        raise Refusal(missing) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Refusal(f"{name} (mounted at {path}) is a symlink loop, expected a folder") from None
        raise Refusal(f"{name} (mounted at {path}) cannot be looked at by {_user()}: {_reason(exc)}") from None
    if not stat.S_ISDIR(mode):
        raise Refusal(f"{name} (mounted at {path}) is {_not_a_folder(mode)}, expected a folder")


def _reason(exc: OSError) -> str:
    """The system's words for an OSError (``strerror``), with the errno's name to search for."""
    code = exc.errno if exc.errno is not None else 0
    return f"{exc.strerror or os.strerror(code)} ({errno.errorcode.get(code, code)})"


def _no_room(out: str) -> str:
    """What OUT's file system has run out of, when statvfs can tell: a full disk and a file system out of
    inodes both fail with ENOSPC, and the cure differs (free space, or remove small files)."""
    try:
        fs = os.statvfs(out)
    except OSError:
        return ""
    if fs.f_files and fs.f_favail == 0:
        return f": no free inodes ({fs.f_files} in all)"
    if fs.f_bavail == 0:
        return ": no free space"
    return ""


def check_out(out: str = OUT) -> None:
    """OUT is mounted, a folder, and this user can create and write a file in it."""
    _check_folder("OUT", out, f"OUT is not mounted at {out}: set OUT to the output folder on the host")
    probe = None
    try:
        fd, probe = tempfile.mkstemp(prefix=".write-check-", dir=out)
        try:
            # One byte, so that a full disk (not only a full inode table) is found before the service starts.
            os.write(fd, b"\0")
        finally:
            os.close(fd)
    except OSError as exc:
        raise _unwritable(out, exc) from None
    finally:
        if probe is not None:
            os.unlink(probe)


def _unwritable(out: str, exc: OSError) -> Refusal:
    """The one line for a probe file OUT would not take: ownership advice only where ownership is the cause."""
    if exc.errno == errno.EROFS:
        return Refusal(f"OUT (mounted at {out}) is read-only: mount it writable")
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        whose = f" of {_user()}" if exc.errno == errno.EDQUOT else ""
        return Refusal(f"OUT (mounted at {out}) has no room for a new file: {_reason(exc)}{_no_room(out)}; "
                       f"free space or files in OUT on the host (or raise the quota{whose})")
    if exc.errno in (errno.EACCES, errno.EPERM):
        uid, gid = os.getuid(), os.getgid()
        return Refusal(f"OUT (mounted at {out}) is not writable by {_user()}: make it theirs "
                       f"(chown {uid}:{gid} OUT) or run as its owner (VIDEOCLIPS_USER=\"$(id -u):$(id -g)\")")
    return Refusal(f"OUT (mounted at {out}) cannot take a new file: {_reason(exc)}")


def check_data(data: str = DATA) -> None:
    """DATA is mounted, a folder, readable and not empty (an engine creates a missing bind source as an
    empty folder)."""
    _check_folder("DATA", data, f"DATA is not mounted at {data}: set DATA to the dataset root on the host")
    try:
        names = os.listdir(data)
    except PermissionError:
        raise Refusal(f"DATA (mounted at {data}) is not readable by {_user()}") from None
    except OSError as exc:  # gone or replaced since the check above, or an I/O error of the mount
        raise Refusal(f"DATA (mounted at {data}) cannot be listed: {_reason(exc)}") from None
    if not names:
        raise Refusal(f"DATA (mounted at {data}) is empty: set DATA to the dataset root "
                      "(annotations/ and videos/ in it)")


def _integer(env: Mapping[str, str], name: str, default: str, low: int, high: int | None = None) -> int:
    text = env.get(name, "").strip() or default
    try:
        value = int(text)
    except ValueError:
        value = low - 1
    if value < low or (high is not None and value > high):
        span = f"{low}..{high}" if high is not None else f"{low} or more"
        raise Refusal(f"{name}={text!r}: needs a whole number, {span}")
    return value


def is_loopback(addr: str) -> bool:
    """Whether ``addr`` reaches the node that connects to it, whichever node that is.

    Node 0's address given as such on another node makes that node wait for a
    master of its own. Loopback is any spelling the resolver takes for this
    host: ``localhost`` in any case, with or without the root's trailing dot;
    127.0.0.0/8 in any form ``inet_aton`` reads (``127.1``, ``2130706433``);
    ``::1`` and IPv4-mapped loopback (``::ffff:127.0.0.1``); and the
    unspecified ``0.0.0.0`` and ``::``, which a connect sends to this host.
    """
    text = addr.strip().lower()
    if text.startswith("[") and text.endswith("]"):  # an IPv6 literal as a URL writes it
        text = text[1:-1]
    if text.removesuffix(".") == "localhost":
        return True
    try:
        ip: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.ip_address(text)
    except ValueError:
        # The short and numeric IPv4 forms getaddrinfo accepts; glibc's inet_aton also takes anything after a
        # space, which no resolver would, so a value with a space is no address at all.
        if not text or any(c.isspace() for c in text):
            return False
        try:
            ip = ipaddress.IPv4Address(socket.inet_aton(text))
        except OSError:
            return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback or ip.is_unspecified


def rendezvous(env: Mapping[str, str]) -> list[str]:
    """torchrun's static rendezvous options from the environment, or a Refusal naming what is missing."""
    nnodes = _integer(env, "NNODES", "1", 1)
    rank = _integer(env, "NODE_RANK", "0", 0)
    port = _integer(env, "MASTER_PORT", "29500", 1, 65535)
    master = env.get("MASTER_ADDR", "").strip()
    if rank >= nnodes:
        raise Refusal(f"NODE_RANK={rank} with NNODES={nnodes}: ranks run 0..{nnodes - 1}; for several nodes "
                      "set NNODES to the node count and MASTER_ADDR to node 0's address on every node")
    if nnodes > 1 and not master:
        raise Refusal(f"NODE_RANK={rank} of NNODES={nnodes} needs MASTER_ADDR: node 0's address, "
                      "the same on every node")
    if nnodes > 1 and rank > 0 and is_loopback(master):
        raise Refusal(f"MASTER_ADDR={master} on node {rank} of {nnodes} names this node: set it to node 0's address")
    return [f"--nnodes={nnodes}", f"--node_rank={rank}", f"--master_addr={master or '127.0.0.1'}",
            f"--master_port={port}"]


def visible_gpus() -> int:
    """GPUs the container sees (0 without a driver, without the toolkit, or with no reservation)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns when it finds no driver; the count says it
        import torch

        return torch.cuda.device_count()


class _DeviceParser(argparse.ArgumentParser):
    """argparse whose errors are a Refusal (argparse would print its usage and exit)."""

    def error(self, message: str) -> NoReturn:
        raise Refusal(f"the trainer's arguments: {message}")


def device(args: Sequence[str]) -> str:
    """The trainer's ``--device``, read as the trainer's argparse reads it (``auto`` when not given).

    Its parser declares ``--device`` as a plain string option on an argparse
    parser with abbreviations allowed (``train.config``, ``convert.format.options``), so
    the last one given wins and ``--device=X`` and unambiguous prefixes
    (``--devi X``) count. The trainer's parser itself is not imported: it
    pulls in torch and the loaders before the checks, and its required
    options would refuse arguments that are only the trainer's business.
    """
    parser = _DeviceParser(add_help=False, allow_abbrev=True)
    parser.add_argument("--device", default="auto")
    known, _ = parser.parse_known_args(list(args))
    return str(known.device)


def on_cpu(args: Sequence[str]) -> bool:
    """Whether the trainer's arguments put it on the CPU: a ``--device`` torch reads as a CPU (``cpu``,
    ``cpu:0``), as the trainer decides it. ``auto`` is not: it means the GPUs, which are checked."""
    import torch

    try:
        return torch.device(device(args)).type == "cpu"
    except RuntimeError:  # not a device at all: the trainer refuses it in its own line
        return False


def usable_cpus() -> int:
    """CPUs this process may run on: the container's cpuset where the system says, else the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no sched_getaffinity (not Linux)
        return os.cpu_count() or 1


def processes(env: Mapping[str, str], args: Sequence[str], gpus: Callable[[], int] = visible_gpus,
              cpus: Callable[[], int] = usable_cpus) -> str:
    """torchrun's --nproc_per_node: checked against the GPUs the container sees (or, on the CPU, its CPUs)."""
    nproc = env.get("NPROC_PER_NODE", "").strip() or "gpu"
    if on_cpu(args):
        if nproc == "gpu":
            raise Refusal("NPROC_PER_NODE=gpu with --device cpu: give a process count (NPROC_PER_NODE=1)")
        count = _integer(env, "NPROC_PER_NODE", "1", 1)
        # More processes than CPUs only share them (each rank is a whole trainer with its own reader
        # threads), and a mistyped count would start that many processes, each importing torch.
        usable = cpus()
        if count > usable:
            raise Refusal(f"NPROC_PER_NODE={count} with --device cpu but the container may use {usable} CPU(s): "
                          f"one process per CPU at most")
        return str(count)
    count = gpus()
    if count == 0:
        raise Refusal(f"no GPU visible in the container: {GPU_HOST}")
    reserved = env.get("GPUS", "").strip() or "all"
    if reserved != "all" and _integer(env, "GPUS", "all", 1) > count:
        raise Refusal(f"GPUS={reserved} but the container sees {count} GPU(s): reserve at most {count}")
    if nproc != "gpu" and _integer(env, "NPROC_PER_NODE", "gpu", 1) > count:
        raise Refusal(f"NPROC_PER_NODE={nproc} but the container sees {count} GPU(s): one process per GPU at most")
    return nproc


def command(role: str, args: list[str], env: Mapping[str, str]) -> list[str]:
    """The checked command line of a service, or a Refusal."""
    if role == "convert":
        # Only the job needs DATA; verify, inspect and demo read or write OUT alone. The mount points are read
        # here, at call time, so that a test can point them at a folder of its own.
        if not args or args[0] not in ("verify", "inspect", "demo", "-h", "--help"):
            check_data(DATA)
        if "-h" not in args and "--help" not in args:
            check_out(OUT)
        return [sys.executable, "-m", "convert", *args]
    if role == "train":
        if "-h" in args or "--help" in args:
            return [sys.executable, "-m", "train", *args]
        check_out(OUT)
        return ["torchrun", *rendezvous(env), f"--nproc_per_node={processes(env, args)}", "-m", "train", *args]
    if role == "check":
        check_out(OUT)
        work = [] if any(a == "--work" or a.startswith("--work=") for a in args) else [f"--work={OUT}/device_check"]
        here = os.path.dirname(os.path.abspath(__file__))
        return [sys.executable, os.path.join(here, os.pardir, "scripts", "device_check.py"), *work, *args]
    raise Refusal(f"unknown role {role!r}: convert, train or check")


def launch(torchrun_args: list[str]) -> int:
    """torchrun (``torch.distributed.run.main``) in this process, PID 1: its exit status, and one line when it ends.

    torchrun itself ends a SIGTERM (``docker stop``) and a trainer that exited
    with a status by raising, which prints a traceback and a failure table
    after the trainer's own one-line message. Here the trainer's lines stand
    and this adds one: the signal or the trainer's status, which is also the
    exit status (128 + the signal for a signal, as a shell reports it).
    """
    import signal

    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    try:
        torchrun(torchrun_args)
    except SignalException as exc:
        sig = signal.Signals(exc.sigval)
        print(f"videoclips train: stopped by {sig.name}; the trainer's lines above say which step it saved "
              "(starting the service again resumes from it)", file=sys.stderr)
        return 128 + sig.value
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        code = failure.exitcode
        how = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
        print(f"videoclips train: trainer rank {rank} {how}; its own message is above", file=sys.stderr)
        return 128 - code if code < 0 else code
    return 0


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: entrypoint.py {convert,train,check} ARGS...", file=sys.stderr)
        return 2
    try:
        cmd = command(argv[0], argv[1:], os.environ)
    except Refusal as exc:
        print(f"videoclips {argv[0]}: error: {exc}", file=sys.stderr)
        return 2
    sys.stdout.flush()
    if cmd[0] == "torchrun":
        return launch(cmd[1:])
    os.execvp(cmd[0], cmd)
    return 0  # not reached: exec replaces this process


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
