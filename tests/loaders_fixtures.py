"""Shards for the loader tests, converted once per session from conftest's ``synth_videos``.

Test modules import these fixtures by name. pytest then registers one fixture
per importing module, so the conversions are cached here, in the module, to
run once per session however many modules use them.
"""

from __future__ import annotations

import os
import shutil

import lmdb
import pytest

_BUILT: dict[tuple, str] = {}


def converted(src: str, base: str, name: str, **config) -> str:
    """Convert ``src`` with ``config`` into ``base/name`` once; the path of the finished conversion."""
    from convert.job.run import JobOptions, run_job
    from convert.worker.plan import ConvertConfig

    key = (src, base, name)
    if key not in _BUILT:
        out = os.path.join(base, name)
        run_job(src, out, ConvertConfig(**config), JobOptions(workers=2, shards=3, progress=False))
        _BUILT[key] = out
    return _BUILT[key]


def tfrecord_converted(src: str, base: str, codec: str) -> str:
    """``src`` as a TFRecord conversion with ``codec`` (3 shards), made once per session under one name.

    Every test module that reads TFRecord shards of the synthetic videos gets
    them here, so ``converted``'s cache (by name) never hands one module a
    conversion another made with other settings.
    """
    return converted(src, base, f"tf_{codec}", codec=codec, backend="tfrecord")


def backend_converted(src: str, base: str, backend: str, codec: str) -> str:
    """``src`` converted with ``backend`` and ``codec`` (3 shards), once per session, under the name every module
    uses for that pair (``raw_root`` and the others for LMDB, ``tfrecord_converted`` for TFRecord)."""
    if backend == "lmdb":
        return converted(src, base, codec, codec=codec)
    if backend == "tfrecord":
        return tfrecord_converted(src, base, codec)
    return converted(src, base, f"{backend}_{codec}", codec=codec, backend=backend)


@pytest.fixture(scope="session")
def loader_base(tmp_path_factory) -> str:
    return str(tmp_path_factory.getbasetemp() / "loader_shards")


@pytest.fixture(scope="session")
def raw_root(synth_videos, loader_base) -> str:
    """Raw 16x128x171 clips in 3 shards."""
    return converted(synth_videos, loader_base, "raw", codec="raw")


@pytest.fixture(scope="session")
def lz4_root(synth_videos, loader_base) -> str:
    return converted(synth_videos, loader_base, "lz4", codec="lz4")


@pytest.fixture(scope="session")
def jpeg_root(synth_videos, loader_base) -> str:
    return converted(synth_videos, loader_base, "jpeg", codec="jpeg")


@pytest.fixture(scope="session")
def short_side_root(synth_videos, loader_base) -> str:
    """Frames keep their aspect (short side 120): clip widths differ between videos."""
    return converted(synth_videos, loader_base, "short120", codec="raw", size=None, short_side=120)


def copy_conversion(root: str, dst: str) -> str:
    """A private copy of a conversion, to damage."""
    shutil.copytree(root, dst, ignore=shutil.ignore_patterns("lock.mdb"))
    return dst


def rewrite_value(shard: str, key: bytes, change) -> None:
    """Replace one stored value by ``change(old_bytes)`` with a write transaction."""
    # room for the new copy of the value (LMDB is copy-on-write)
    size = os.path.getsize(os.path.join(shard, "data.mdb")) * 2 + (64 << 20)
    env = lmdb.open(shard, readonly=False, subdir=True, max_dbs=0, lock=False, map_size=size)
    try:
        with env.begin(write=True) as txn:
            old = txn.get(key)
            if old is None:
                raise KeyError(key)
            txn.put(key, change(bytes(old)))
    finally:
        env.close()


def payloads(store, indices) -> list:
    """Headers and copies of the payloads of clips ``indices`` of ``store`` (through ``ClipStore.read``)."""
    indices = list(indices)
    out: list = [None] * len(indices)
    for clip in store.read(indices):
        out[clip.position] = (clip.header, bytes(clip.payload))
    return out
