"""The train package at import: its modules import one another without a cycle, each on its own, and
importing them registers nothing (the exit handler comes with a run's start)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap

from .train_fixtures import ROOT, subprocess_env

TRAIN = os.path.join(ROOT, "train")


def _modules() -> dict[str, str]:
    """Module name -> file of every module of the package (``train`` itself is its __init__)."""
    names = sorted(f[:-3] for f in os.listdir(TRAIN) if f.endswith(".py"))
    return {("train" if n == "__init__" else f"train.{n}"): os.path.join(TRAIN, f"{n}.py") for n in names}


def _imported(path: str) -> set[str]:
    """The train modules a file imports anywhere: at the top, in functions, under TYPE_CHECKING."""
    with open(path) as f:
        tree = ast.parse(f.read())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "train"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # every module sits directly in the package
                target = "train" + (f".{node.module}" if node.module else "")
            elif node.module and node.module.split(".")[0] == "train":
                target = node.module
            else:
                continue
            if target != "train":
                found.add(target)
                continue
            for a in node.names:  # from . import x: a module, or a name of the package's __init__
                module = os.path.isfile(os.path.join(TRAIN, f"{a.name}.py"))
                found.add(f"train.{a.name}" if module else "train")
    return found


def import_graph() -> dict[str, set[str]]:
    """Module -> the train modules it imports (itself left out)."""
    return {name: _imported(path) - {name} for name, path in _modules().items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a], or None when the graph is acyclic."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_the_import_graph_of_train_is_acyclic():
    graph = import_graph()
    assert {"train", "train.config", "train.args", "train.data", "train.main"} <= set(graph)
    assert graph["train.config"] & {"train.args", "train.data", "train.main"} == set()
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


# Each module imported first, in an interpreter where no train module is loaded yet (the third-party
# packages stay: what is checked is the order the package's own modules import each other in).
EACH_FIRST = textwrap.dedent("""
    import importlib, sys
    import numpy, torch, loaders
    failed = []
    for name in sys.argv[1:]:
        for loaded in [m for m in sys.modules if m == "train" or m.startswith("train.")]:
            del sys.modules[loaded]
        try:
            importlib.import_module(name)
        except Exception as exc:
            failed.append(f"{name}: {type(exc).__name__}: {exc}")
    print("\\n".join(failed))
""")


def test_every_module_imports_on_its_own():
    names = [n for n in _modules() if n != "train.__main__"]  # __main__ runs the trainer
    proc = subprocess.run([sys.executable, "-c", EACH_FIRST, *names], cwd=ROOT, env=subprocess_env(),
                          capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == ""

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
