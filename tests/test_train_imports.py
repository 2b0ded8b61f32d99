"""The train package at import: it registers nothing (the exit handler comes with a run's start)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from .train_fixtures import ROOT, subprocess_env

# Every module of train imported in a fresh interpreter, with atexit.register watched; then the entry
# points' registration, twice (two runs in one process). At exit the handler reports whether
# multiprocessing's exit handler (which sets multiprocessing.util._exiting) has run yet.
REGISTERED = textwrap.dedent("""
    import atexit, importlib, json, multiprocessing, pkgutil
    registered = []
    _register = atexit.register

    def spy(fn, *args, **kwargs):
        registered.append(getattr(fn, "__module__", None) or "")
        return _register(fn, *args, **kwargs)

    atexit.register = spy
    import train
    for info in sorted(pkgutil.iter_modules(train.__path__), key=lambda m: m.name):
        if info.name != "__main__":  # runs the trainer
            importlib.import_module("train." + info.name)
    print(json.dumps([m for m in registered if m.split(".")[0] == "train"]), flush=True)
    from train.workers import end_workers_at_exit
    end_workers_at_exit()
    end_workers_at_exit()
    print(json.dumps([m for m in registered if m.split(".")[0] == "train"]), flush=True)

    def children():  # what kill_workers_left_at_exit asks first
        print("handler ran; multiprocessing's had run:", multiprocessing.util._exiting, flush=True)
        return []

    multiprocessing.active_children = children
""")


def test_importing_train_registers_nothing_at_exit_and_a_run_registers_one_handler():
    proc = subprocess.run([sys.executable, "-c", REGISTERED], cwd=ROOT, env=subprocess_env(), capture_output=True,
                          text=True, timeout=240, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    at_import, after_runs, *at_exit = proc.stdout.strip().splitlines()
    assert json.loads(at_import) == []
    assert json.loads(after_runs) == ["train.workers", "train.workers"]
    assert at_exit == ["handler ran; multiprocessing's had run: False"]  # once, and first
