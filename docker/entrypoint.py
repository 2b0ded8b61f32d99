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

import os
import sys
import tempfile
import warnings
from collections.abc import Callable, Mapping, Sequence

DATA = "/data"
OUT = "/out"
GPU_HOST = ("the host needs an NVIDIA driver of the 580 branch or newer and the NVIDIA Container Toolkit "
            "(docs/docker.md, GPU nodes); docker/compose.cpu.yml runs the service on the CPU")
LOOPBACK = ("127.0.0.1", "localhost", "::1")


class Refusal(Exception):
    """A precondition of the service that does not hold: one line for the user."""


def _user() -> str:
    return f"uid {os.getuid()} gid {os.getgid()}"


def check_out(out: str = OUT) -> None:
    """OUT is mounted and this user can create files in it."""
    if not os.path.isdir(out):
        raise Refusal(f"OUT is not mounted at {out}: set OUT to the output folder on the host")
    try:
        fd, probe = tempfile.mkstemp(prefix=".write-check-", dir=out)
    except OSError as exc:
        if exc.errno == 30:  # EROFS
            raise Refusal(f"OUT (mounted at {out}) is read-only: mount it writable") from None
        uid, gid = os.getuid(), os.getgid()
        raise Refusal(f"OUT (mounted at {out}) is not writable by {_user()}: make it theirs "
                      f"(chown {uid}:{gid} OUT) or run as its owner (VIDEOCLIPS_USER=\"$(id -u):$(id -g)\")"
                      ) from None
    os.close(fd)
    os.unlink(probe)


def check_data(data: str = DATA) -> None:
    """DATA is mounted, readable and not empty (an engine creates a missing bind source as an empty folder)."""
    try:
        names = os.listdir(data)
    except FileNotFoundError:
        raise Refusal(f"DATA is not mounted at {data}: set DATA to the dataset root on the host") from None
    except PermissionError:
        raise Refusal(f"DATA (mounted at {data}) is not readable by {_user()}") from None
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
    if nnodes > 1 and rank > 0 and master in LOOPBACK:
        raise Refusal(f"MASTER_ADDR={master} on node {rank} of {nnodes} names this node: set it to node 0's address")
    return [f"--nnodes={nnodes}", f"--node_rank={rank}", f"--master_addr={master or '127.0.0.1'}",
            f"--master_port={port}"]


def visible_gpus() -> int:
    """GPUs the container sees (0 without a driver, without the toolkit, or with no reservation)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns when it finds no driver; the count says it
        import torch

        return torch.cuda.device_count()


def on_cpu(args: Sequence[str]) -> bool:
    """Whether the trainer's arguments say ``--device cpu`` (the trainer's own option, read, not duplicated)."""
    for i, arg in enumerate(args):
        if arg == "--device" and i + 1 < len(args):
            return args[i + 1] == "cpu"
        if arg.startswith("--device="):
            return arg.partition("=")[2] == "cpu"
    return False


def processes(env: Mapping[str, str], args: Sequence[str], gpus: Callable[[], int] = visible_gpus) -> str:
    """torchrun's --nproc_per_node: checked against the GPUs the container sees (or, on the CPU, a count)."""
    nproc = env.get("NPROC_PER_NODE", "").strip() or "gpu"
    if on_cpu(args):
        if nproc == "gpu":
            raise Refusal("NPROC_PER_NODE=gpu with --device cpu: give a process count (NPROC_PER_NODE=1)")
        return str(_integer(env, "NPROC_PER_NODE", "1", 1))
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
        # Only the job needs DATA; verify, inspect and demo read or write OUT alone.
        if not args or args[0] not in ("verify", "inspect", "demo", "-h", "--help"):
            check_data()
        if "-h" not in args and "--help" not in args:
            check_out()
        return [sys.executable, "-m", "convert", *args]
    if role == "train":
        if "-h" in args or "--help" in args:
            return [sys.executable, "-m", "train", *args]
        check_out()
        return ["torchrun", *rendezvous(env), f"--nproc_per_node={processes(env, args)}", "-m", "train", *args]
    if role == "check":
        check_out()
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
