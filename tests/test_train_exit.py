"""A trainer process exits even when DataLoader workers that ignore SIGTERM outlive their loader."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Workers set up as the trainer sets them up (ignoring SIGTERM, the exit handler registered as a run
# registers it), whose iterator is still held when the interpreter exits: multiprocessing's exit handler
# would SIGTERM and join them forever.
SCRIPT = textwrap.dedent("""
    import sys
    import torch
    from torch.utils.data import DataLoader
    from train.workers import end_workers_at_exit, ignore_stop_signals

    end_workers_at_exit()  # what the trainer's entry points do when a run starts
    loader = DataLoader(list(range(64)), batch_size=4, num_workers=2, persistent_workers=True,
                        worker_init_fn=ignore_stop_signals)
    it = iter(loader)
    assert torch.equal(next(it), torch.arange(4))
    pids = sorted(w.pid for w in it._workers)
    print(" ".join(map(str, pids)), flush=True)
    if sys.argv[1] == "unregister":
        import atexit
        from train.workers import kill_workers_left_at_exit
        atexit.unregister(kill_workers_left_at_exit)
    print("exiting", flush=True)  # all that is left is the interpreter's exit
""")
# How long a process that reached its exit gets to end before it counts as hung: the exit with the handler takes
# a fraction of this; the hang without it lasts forever.
HANG_S = 5.0


def _run(mode: str, timeout: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-c", SCRIPT, mode], env=env, capture_output=True, text=True,
                          timeout=timeout)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with open(f"/proc/{pid}/stat") as f:  # a zombie not yet reaped by init counts as gone
        return f.read().split(")")[-1].split()[0] == "Z"


def test_workers_left_at_exit_are_killed_and_the_process_exits():
    done = _run("keep", timeout=120)
    assert done.returncode == 0, done.stderr
    pids = [int(p) for p in done.stdout.splitlines()[0].split()]
    assert done.stdout.splitlines()[1:] == ["exiting"]
    assert len(pids) == 2 and all(_gone(p) for p in pids)


def test_without_the_handler_the_process_would_hang_at_exit():
    # The case the handler exists for: the same script, handler removed, does not exit by itself. Timed from
    # the moment it reaches its exit (not from its start, which imports torch), so a slow start cannot pass for
    # the hang.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, "unregister"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    pids = [int(p) for p in proc.stdout.readline().split()]
    assert len(pids) == 2 and proc.stdout.readline() == "exiting\n"
    try:
        code = proc.wait(timeout=HANG_S)
    except subprocess.TimeoutExpired:
        for pid in [proc.pid, *pids]:
            try:
                os.kill(pid, 9)  # the hung process and its orphaned workers
            except ProcessLookupError:
                pass
        proc.wait()
        proc.stdout.close()
        return
    raise AssertionError(f"exited with {code} without the handler; the test no longer shows the hang")
