"""The shape the packages keep: the format layer below both sides, no import cycles, light readers.

Read from the code itself (its import statements, parsed), so a change that
breaks the layering fails here, not in a later review.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys

import pytest

from convert.format import BACKENDS

from .backend_params import ALL, TEST_BACKENDS
from .conftest import ROOT

PACKAGES = ("convert", "loaders", "train")


def _modules() -> dict[str, str]:
    """Every module of the installed packages: dotted name -> file."""
    found = {}
    for package in PACKAGES:
        for folder, _, files in os.walk(os.path.join(ROOT, package)):
            for name in files:
                if name.endswith(".py"):
                    rel = os.path.relpath(os.path.join(folder, name), ROOT)[:-3].replace(os.sep, ".")
                    found[rel[: -len(".__init__")] if rel.endswith(".__init__") else rel] = os.path.join(folder, name)
    return found


def _run_time_nodes(tree: ast.Module) -> list[ast.AST]:
    """Every node but those under ``if TYPE_CHECKING:`` (imports for the type checker, never run)."""
    typing_only = {id(n) for top in ast.walk(tree) if isinstance(top, ast.If) and "TYPE_CHECKING" in
                   ast.unparse(top.test) for stmt in top.body for n in ast.walk(stmt)}
    return [n for n in ast.walk(tree) if id(n) not in typing_only]


def _imports(module: str, path: str, *, run_time_only: bool) -> set[str]:
    """The project modules ``module`` imports anywhere (``run_time_only``: leaving out type-checking imports)."""
    tree = ast.parse(open(path).read(), path)
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    nodes = _run_time_nodes(tree) if run_time_only else list(ast.walk(tree))
    out: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            out.add(target)
            out |= {f"{target}.{a.name}" for a in node.names}
    return {m for m in out if m.split(".")[0] in PACKAGES}


def _graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports: at any time it runs (functions' imports included) and for the
    type checker (``if TYPE_CHECKING:``), so a cycle closed through a lazy or a type-only import is one too."""
    modules = _modules()
    return {name: {d for d in _imports(name, path, run_time_only=False) if d in modules and d != name}
            for name, path in modules.items()}


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_loaders_import_nothing_of_convert_but_its_format_and_shard_access():
    modules = _modules()
    bad = {}
    for name, path in modules.items():
        if name.split(".")[0] == "loaders":
            wrong = {m for m in _imports(name, path, run_time_only=False)
                     if _within(m, "convert") and not (_within(m, "convert.format") or _within(m, "convert.store"))}
            if wrong:
                bad[name] = sorted(wrong)
    assert bad == {}


def test_the_format_layer_imports_nothing_above_it():
    bad = {}
    for name, path in _modules().items():
        if _within(name, "convert.format"):
            wrong = {m for m in _imports(name, path, run_time_only=False) if not _within(m, "convert.format")}
            if wrong:
                bad[name] = sorted(wrong)
    assert bad == {}


def test_the_import_graph_counts_lazy_and_type_only_imports(tmp_path):
    """The cycle test's graph sees an import inside a function and one under ``if TYPE_CHECKING:``: a cycle closed
    through either (as ``convert.store``'s source and cache could close one) fails it too."""
    path = tmp_path / "m.py"
    path.write_text("from typing import TYPE_CHECKING\n"
                    "if TYPE_CHECKING:\n    from .cache.cache import ShardCache\n"
                    "def f():\n    from .remote import is_url\n    return is_url\n")
    found = _imports("convert.store.source", str(path), run_time_only=False)
    assert {"convert.store.cache.cache", "convert.store.remote"} <= found
    assert "convert.store.cache.cache" not in _imports("convert.store.source", str(path), run_time_only=True)


# The converting side's layers, lowest first (convert/README.md): a module imports its own layer and those
# below it, never one above, so each layer can be read (and run) without those above it.
CONVERT_LAYERS = ("convert.format", "convert.store", "convert.worker", "convert.job", "convert")
# A module kept at the top level that belongs to a lower layer: the job's options, beside the command line
# that declares flags from them; the stop signals (standard library only, so a command takes them before any
# heavy import), which the shard verifier's and the job's children block while they start.
LAYER_OF = {"convert.options": "convert.job", "convert.signals": "convert.store"}
MAX_CONVERT_TOP_LEVEL = 12


def _convert_layer(module: str) -> int:
    """The rank of ``module``'s layer in ``CONVERT_LAYERS`` (its longest matching prefix)."""
    module = LAYER_OF.get(module, module)
    return max(i for i, layer in enumerate(CONVERT_LAYERS) if module == layer or module.startswith(layer + "."))


def test_each_layer_of_convert_imports_only_layers_below_it():
    upward = sorted(f"{name} ({CONVERT_LAYERS[_convert_layer(name)]}) imports {dep} "
                    f"({CONVERT_LAYERS[_convert_layer(dep)]})"
                    for name, deps in _graph().items() if name.split(".")[0] == "convert"
                    for dep in deps if dep.split(".")[0] == "convert" and _convert_layer(dep) > _convert_layer(name))
    assert upward == []


def test_the_layer_table_names_real_packages_and_convert_keeps_a_short_top_level():
    modules = _modules()
    assert [layer for layer in CONVERT_LAYERS if layer not in modules] == []
    assert [name for name in LAYER_OF if name not in modules] == []
    top = sorted(name for name in os.listdir(os.path.join(ROOT, "convert")) if name.endswith(".py"))
    assert len(top) <= MAX_CONVERT_TOP_LEVEL, top


def test_the_stop_signal_pair_is_written_once():
    """SIGINT and SIGTERM together are ``convert.signals.STOP_SIGNALS``, and a set of stop signals elsewhere (the
    job's, the verifier's, the trainer's) is spelled from it: the pair was written out in six places."""
    found = []
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(open(path).read(), path)):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                if {"SIGINT", "SIGTERM"} <= {ast.unparse(e).rpartition(".")[2] for e in node.elts}:
                    found.append(name)
    assert found == ["convert.signals"]


def test_child_processes_run_this_checkout_from_any_folder(tmp_path):
    """A shard process or the fork server is ``python -m convert.worker...`` with ``package_env()``: its path
    must hold the folder above the ``convert`` package, wherever the job runs."""
    from convert.job.supervise import package_env

    # -S: no site-packages, so an installed copy of the project cannot stand in for the path's (and none of
    # the packages importing ``convert`` needs: its file is found, not run).
    code = "import importlib.util; print(importlib.util.find_spec('convert').origin)"
    got = subprocess.run([sys.executable, "-S", "-c", code],
                         cwd=tmp_path, env=package_env(), capture_output=True, text=True, timeout=120)
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip() == os.path.join(ROOT, "convert", "__init__.py")


def test_no_import_cycles_between_modules():
    graph = _graph()
    state: dict[str, int] = {}
    cycle: list[str] = []

    def visit(node: str, path: list[str]) -> bool:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle.extend(path[path.index(nxt):] + [nxt] if nxt in path else [node, nxt])
                return True
            if state.get(nxt) is None and visit(nxt, [*path, nxt]):
                return True
        state[node] = 2
        return False

    for node in sorted(graph):
        if state.get(node) is None and visit(node, [node]):
            break
    assert cycle == [], " -> ".join(cycle)


def test_nothing_outside_the_model_registry_names_a_network():
    """The trainer, its evaluation, the probe, the benchmarks and the checks build networks through
    ``train.models.build_model``: no module outside ``train/models/`` (nor a script or benchmark) imports a
    network's own module, so a new entry needs no edit elsewhere."""
    networks = ("train.models.c3d", "train.models.resnet3d", "train.models.i3d")
    users = dict(_modules())
    for folder in ("benchmarks", "scripts"):
        for name in sorted(os.listdir(os.path.join(ROOT, folder))):
            if name.endswith(".py"):
                users[f"{folder}.{name[:-3]}"] = os.path.join(ROOT, folder, name)
    offenders = sorted(f"{module} imports {target}" for module, path in users.items()
                       if not module.startswith("train.models")
                       for target in _imports(module, path, run_time_only=False)
                       if target.startswith(networks))
    assert offenders == []


# The names of each backend's files (FORMAT.md, its section; a test backend's own README): only the backend's own
# package may spell them.
BACKEND_FILE_NAMES = {"lmdb": ("data.mdb", "lock.mdb", "index.json"),
                      "tfrecord": (".tfrecord", ".idx", "shard.json", "complete.json"),
                      "tar": ("clips.tar",)}


def _strings(path: str) -> list[str]:
    """The string constants of a module that are not docstrings (what the code uses, not what it says)."""
    tree = ast.parse(open(path).read(), path)
    docs = {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body
            and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in docs]


def test_no_module_outside_a_backend_names_its_files():
    """The cache, the uploader, the verifier, the loaders name no backend's files: each backend declares them
    (``ShardFiles``) and a manifest lists them, so a new backend needs no edit elsewhere."""
    assert set(BACKEND_FILE_NAMES) == set(BACKENDS)
    # A test backend's names are checked in the other test modules too: the suites that run over it take its
    # files from the manifest and its declaration, as the package does.
    tests = {f"tests.{name[:-3]}": os.path.join(ROOT, "tests", name) for name in os.listdir(os.path.join(ROOT, "tests"))
             if name.endswith(".py") and name != "test_architecture.py"}
    offenders = []
    for name, path in {**_modules(), **tests}.items():
        for backend, names in BACKEND_FILE_NAMES.items():
            own = BACKENDS[backend].writer.__module__.rpartition(".")[0]  # the package holding the backend
            if _within(name, own) or (name.startswith("tests.") and backend not in TEST_BACKENDS):
                continue
            offenders += [f"{name} names {token!r} ({backend})" for text in _strings(path) for token in names
                          if token in text]
    assert offenders == []


def test_nothing_is_registered_at_import():
    """No fork hook, exit handler or signal handler is installed by importing a module of the packages."""
    hooks = ("register_at_fork", "atexit.register", "signal.signal")
    bad = []
    for name, path in _modules().items():
        tree = ast.parse(open(path).read(), path)
        for top in tree.body:
            if isinstance(top, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            text = ast.unparse(top)
            if any(h in text for h in hooks):
                bad.append(f"{name}: {text.splitlines()[0]}")
    assert bad == []


@pytest.mark.parametrize("backend", ALL)
def test_reading_a_clip_imports_neither_pyav_nor_torch(backend, synth_videos, tmp_path):
    from convert.job.run import JobOptions, run_job
    from convert.worker.plan import ConvertConfig

    out = str(tmp_path / backend)
    run_job(synth_videos, out, ConvertConfig(backend=backend, codec="lz4"), JobOptions(workers=1, shards=1,
                                                                                       progress=False))
    code = ("import sys\n"
            "import loaders\n"
            f"clip = loaders.open_clips({out!r})[0].clip\n"
            "assert clip.shape[0] == 16\n"
            # fsspec and s3fs: only a URL needs them (convert.store.remote imports them on first use).
            "print(sorted(m for m in ('av', 'torch', 'nvidia.dali', 'fsspec', 's3fs') if m in sys.modules))\n")
    got = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip() == "[]"
