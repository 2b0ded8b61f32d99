"""DataLoader worker processes (``--loader processes``): the signals they ignore, and their end at exit.

Nothing here acts on import: the entry points call ``end_workers_at_exit``
when a run starts (``train.main`` for training, the demo and
scripts/device_check.py; ``train.evalcmd`` for ``python -m train eval``).
"""

from __future__ import annotations

import atexit
import multiprocessing
import multiprocessing.util  # registers multiprocessing's exit handler, which ours must run before (see below)
import signal
import threading
import time

from convert.signals import STOP_SIGNALS as COMMAND_STOP_SIGNALS

# What stops a run (train.main.stop_signals), which its DataLoader workers ignore: the commands' stop signals
# (SIGINT, SIGTERM, SIGHUP), and the one a cluster sends before it preempts a job.
STOP_SIGNALS = (*COMMAND_STOP_SIGNALS, signal.SIGUSR1)


def ignore_stop_signals(worker_id: int) -> None:
    """DataLoader workers ignore SIGTERM/SIGINT/SIGHUP/SIGUSR1: a cluster signals the whole process group on
    preemption, as a terminal's Ctrl-C and its closing do, and the trainer (which saves and stops, see
    train.main.stop_signals) still needs its workers' batches until then; the workers end when the trainer
    closes the loader."""
    for s in STOP_SIGNALS:
        signal.signal(s, signal.SIG_IGN)


def kill_workers_left_at_exit(grace: float = 2.0) -> int:
    """End the daemon child processes still alive: SIGTERM, then SIGKILL after ``grace`` s; how many needed
    the SIGKILL.

    Run at exit (registered by ``end_workers_at_exit``). multiprocessing's own
    exit handler sends its daemon children SIGTERM and then joins them without
    a bound, so a DataLoader worker that ignores SIGTERM (ignore_stop_signals)
    would keep the process from ever exiting. Workers outlive their loader
    when an error's traceback still holds the loader's iterator at exit (seen:
    the test process hung at exit in 3 of 8 runs of tests/test_train_reading.py).
    Daemon children are the ones multiprocessing would end at exit anyway;
    this only adds the SIGKILL for those that ignore the SIGTERM.
    """
    left = [p for p in multiprocessing.active_children() if p.daemon]
    if not left:
        return 0
    if threading.current_thread() is threading.main_thread():
        # torch's SIGCHLD handler raises when a worker dies by a signal: here that is the intent.
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for p in left:
        p.terminate()
    deadline = time.monotonic() + grace
    for p in left:
        p.join(max(0.0, deadline - time.monotonic()))
    stuck = [p for p in left if p.is_alive()]
    for p in stuck:
        p.kill()
    for p in stuck:
        p.join(5)
    return len(stuck)


def end_workers_at_exit() -> None:
    """Have ``kill_workers_left_at_exit`` run at interpreter exit, before multiprocessing's own exit handler.

    Called by the entry points when a run starts. atexit calls handlers
    last-registered first, and multiprocessing.util registered its handler
    when it was imported (at the top of this module, so before any call
    here): ours, registered now, runs first. Registering again after
    unregistering keeps it one handler, still the last registered, however
    many runs one process starts.
    """
    atexit.unregister(kill_workers_left_at_exit)
    atexit.register(kill_workers_left_at_exit)
