"""Fixtures shared by the whole suite: the shared test videos (synthetic and, when present, real) and one
synthetic dataset."""

from __future__ import annotations

import os
import shutil
import sys

import pytest

from .remote_fixtures import s3_server  # noqa: F401 - one S3 server for every module (see remote_fixtures)
from .videos import VideoSet

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# The real test videos, read in place; VIDEOCLIPS_SHARED_VIDEOS names another folder (a missing one runs
# the suite as a clone without them does).
SHARED_VIDEOS = os.path.normpath(os.environ.get("VIDEOCLIPS_SHARED_VIDEOS")
                                 or os.path.join(ROOT, "..", "shared", "testdata", "videos"))
# Tiers of the shared videos every test of them runs on: the synthetic stand-ins always, the real files
# too when they are there. Decided at collection, so a clone without them has no real-tier test to skip.
VIDEO_TIERS = ("synthetic", "real") if os.path.isdir(SHARED_VIDEOS) else ("synthetic",)
# Every shard process of the suite installs the fault hook (a no-op unless a test sets CONVERT_TEST_FAULT).
os.environ.setdefault("CONVERT_SHARD_HOOK", "tests.faults:install")
# The test backend (tests/tarbackend) plugged in: every process of the suite finds it (tests/backend_params.py).
os.environ["VIDEOCLIPS_EXTRA_BACKENDS"] = ",".join(filter(None, (os.environ.get("VIDEOCLIPS_EXTRA_BACKENDS"),
                                                                 "tar=tests.tarbackend:BACKEND")))
# The user's shard cache as it was before the suite pointed XDG_CACHE_HOME elsewhere (see user_cache_dir below):
# what the suite must never write into.
REAL_CACHE_DIR = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
                              "videoclips")


@pytest.fixture(scope="session", autouse=True)
def session_cache_home(tmp_path_factory):
    """XDG_CACHE_HOME for the whole session, a temporary folder: a remote read without ``cache_dir`` (and a
    conversion to a URL, which stages under it) writes there, not into the user's ``~/.cache/videoclips``.
    Set in ``os.environ``, so every process a test starts inherits it. Covers the session and module
    fixtures, which are made before a test's own fixtures."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg_cache_session")))
        yield


@pytest.fixture(autouse=True)
def user_cache_dir(session_cache_home, tmp_path_factory, monkeypatch) -> str:
    """Each test its own XDG_CACHE_HOME (so no test reads another's cached shards by chance); the
    ``videoclips`` folder under it, the default cache folder during the test."""
    home = tmp_path_factory.mktemp("xdg_cache")
    monkeypatch.setenv("XDG_CACHE_HOME", str(home))
    return str(home / "videoclips")


def load_script(name: str):
    """``scripts/<name>.py`` as a module (scripts are run as files, not installed)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"scripts_{name}", os.path.join(ROOT, "scripts", f"{name}.py"))
    assert spec is not None and spec.loader is not None  # a .py file's path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def stand_in_videos(tmp_path_factory) -> str:
    """Folder of the synthetic stand-ins for the shared videos (tests/videos.py), written once per session."""
    from .videos import write_all

    return write_all(str(tmp_path_factory.mktemp("stand_ins")))


@pytest.fixture(scope="session", params=VIDEO_TIERS)
def videos(request) -> VideoSet:
    """The shared test videos of one tier; a test using them runs once per tier."""
    if request.param == "real":
        return VideoSet("real", SHARED_VIDEOS)
    return VideoSet("synthetic", request.getfixturevalue("stand_in_videos"))


@pytest.fixture()
def touch_video(videos):
    """``touch_video(path)`` puts a copy of a small shared video (HEVC, 10 frames) at ``path``."""
    def touch(path: str) -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        shutil.copyfile(videos.path("torchcodec__h265_video.mp4"), path)

    return touch


@pytest.fixture()
def one_thread():
    """torch's math on one thread for the test (steadier timings and rounding on a busy machine)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def synth_videos(tmp_path_factory) -> str:
    """Five motion classes, 4 short h264 videos each, at mixed sizes and frame rates."""
    from convert.synth import make_dataset

    root = str(tmp_path_factory.mktemp("synth"))
    make_dataset(root, per_class=4, seconds=1.5, seed=7)
    return root


TINY = {"a": ["mmaction2__part_0.mp4", "mmcv__test.mp4"], "b": ["moviepy__big_buck_bunny_432_433.webm",
                                                                 "mmaction2__test.avi"]}


def _tiny(root, videos: VideoSet) -> str:
    for cls, names in TINY.items():
        (root / cls).mkdir(parents=True)
        for name in names:
            os.symlink(videos.path(name), root / cls / name)
    return str(root)


@pytest.fixture()
def tiny_tree(tmp_path, videos) -> str:
    """Class folders of symlinks to four of the shared videos (read in place); per test, so tests may add to it."""
    return _tiny(tmp_path / "src", videos)


@pytest.fixture()
def tiny_synthetic_tree(tmp_path, stand_in_videos) -> str:
    """``tiny_tree`` of the synthetic stand-ins only: for tests of the job's machinery, which no video's
    footage changes (each runs once, not once per tier)."""
    return _tiny(tmp_path / "src", VideoSet("synthetic", stand_in_videos))
