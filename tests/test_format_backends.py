"""Backends plugged in by name (``$VIDEOCLIPS_EXTRA_BACKENDS``): read on every lookup, imported only when looked
up, every mistake one line naming the variable; the command line offers what is plugged in."""

from __future__ import annotations

import subprocess
import sys

import pytest

from convert.format import BACKENDS, FormatError, get_backend
from convert.format.backends import BUILT_IN, EXTRA_BACKENDS_ENV

from .conftest import ROOT


def test_the_suite_plugs_in_the_tar_backend_after_the_built_in_ones():
    assert list(BACKENDS)[:2] == ["lmdb", "tfrecord"] and "tar" in BACKENDS and "tar" in BACKENDS.plugged_in()
    assert get_backend("tar").reader.__module__ == "tests.tarbackend.reader"


def test_names_come_from_the_variable_without_importing_and_a_lookup_imports(monkeypatch):
    monkeypatch.setenv(EXTRA_BACKENDS_ENV, "ghost=tests.no_such_module:BACKEND, tar=tests.tarbackend:BACKEND")
    assert list(BACKENDS) == ["lmdb", "tfrecord", "ghost", "tar"] and "ghost" in BACKENDS and len(BACKENDS) == 4
    with pytest.raises(FormatError) as err:
        get_backend("ghost")
    assert str(err.value).startswith(f"${EXTRA_BACKENDS_ENV}: ghost=tests.no_such_module:BACKEND: cannot import it")
    assert get_backend("tar").name == "tar"
    monkeypatch.delenv(EXTRA_BACKENDS_ENV)
    assert list(BACKENDS) == ["lmdb", "tfrecord"] and "tar" not in BACKENDS
    with pytest.raises(FormatError, match="unknown backend 'tar'; this reader knows lmdb, tfrecord$"):
        get_backend("tar")


@pytest.mark.parametrize("value, words", [
    ("tar", "entry 'tar' is not name=module:attribute"),
    ("tar=tests.tarbackend", "entry 'tar=tests.tarbackend' is not name=module:attribute"),
    ("lmdb=tests.tarbackend:BACKEND", "takes the name of the built-in backend 'lmdb'"),
    ("tar=tests.tarbackend:NOTHING", "tar=tests.tarbackend:NOTHING: no such attribute"),
    ("tar=tests.tarbackend:TarReader", "names a ABCMeta, not a convert.format.base.Backend"),
    ("zip=tests.tarbackend:BACKEND", "zip=tests.tarbackend:BACKEND: names the backend called 'tar'"),
])
def test_each_mistake_is_one_line_naming_the_variable(monkeypatch, value, words):
    monkeypatch.setenv(EXTRA_BACKENDS_ENV, value)
    name = value.partition("=")[0]
    with pytest.raises(FormatError) as err:  # a built-in name is looked up without the variable: list them all
        get_backend(name) if name not in BUILT_IN else list(BACKENDS)
    assert str(err.value).startswith(f"${EXTRA_BACKENDS_ENV}: ") and words in str(err.value)
    assert "\n" not in str(err.value)


def test_the_command_line_offers_a_plugged_in_backend_and_its_options():
    """In a fresh interpreter (as a shard process starts): ``--backend tar`` and tar's own flag come from the
    variable it inherits; without it, neither is there."""
    code = ("from convert.cli import build_parser\n"
            "a = build_parser().parse_args(['SRC', 'OUT', '--backend', 'tar', '--tar-sync'])\n"
            "print(a.backend, a.store_tar_sync)\n")
    env = {"PATH": "/usr/bin:/bin", EXTRA_BACKENDS_ENV: "tar=tests.tarbackend:BACKEND"}
    got = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, env=env, timeout=60)
    assert got.returncode == 0 and got.stdout == "tar True\n", got.stderr
    del env[EXTRA_BACKENDS_ENV]
    got = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, env=env, timeout=60)
    assert got.returncode != 0 and "invalid choice: 'tar'" in got.stderr, got.stderr
