"""Fixtures shared by the whole suite: the real test videos and one synthetic dataset."""

from __future__ import annotations

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

SHARED_VIDEOS = os.path.normpath(os.path.join(ROOT, "..", "shared", "testdata", "videos"))
# Every shard process of the suite installs the fault hook (a no-op unless a test sets CONVERT_TEST_FAULT).
os.environ.setdefault("CONVERT_SHARD_HOOK", "tests.faults:install")


def load_script(name: str):
    """``scripts/<name>.py`` as a module (scripts are run as files, not installed)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"scripts_{name}", os.path.join(ROOT, "scripts", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def shared_video(name: str) -> str:
    path = os.path.join(SHARED_VIDEOS, name)
    if not os.path.exists(path):
        pytest.skip(f"shared test video {name} not found at {SHARED_VIDEOS}")
    return path


@pytest.fixture(scope="session")
def shared_videos() -> str:
    if not os.path.isdir(SHARED_VIDEOS):
        pytest.skip(f"{SHARED_VIDEOS} missing")
    return SHARED_VIDEOS


@pytest.fixture(scope="session")
def synth_videos(tmp_path_factory) -> str:
    """Five motion classes, 4 short h264 videos each, at mixed sizes and frame rates."""
    from convert.synth import make_dataset

    root = str(tmp_path_factory.mktemp("synth"))
    make_dataset(root, per_class=4, seconds=1.5, seed=7)
    return root


TINY = {"a": ["mmaction2__part_0.mp4", "mmcv__test.mp4"], "b": ["moviepy__big_buck_bunny_432_433.webm",
                                                                 "mmaction2__test.avi"]}


@pytest.fixture()
def tiny_tree(tmp_path, shared_videos) -> str:
    """Class folders of symlinks to four real shared videos (read in place); per test, so tests may add to it."""
    root = tmp_path / "src"
    for cls, names in TINY.items():
        (root / cls).mkdir(parents=True)
        for name in names:
            os.symlink(os.path.join(shared_videos, name), root / cls / name)
    return str(root)
