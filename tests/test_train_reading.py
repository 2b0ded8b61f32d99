"""Reading failures during training: a damaged payload (raw always, other codecs with --verify-data), a loader
worker killed by a signal.

Both stop the run with one line that names what happened and what to run, instead of a traceback.
"""

from __future__ import annotations

import os
import re
import signal

import numpy as np
import pytest
from torch.utils.data import get_worker_info

import train.data
from convert.format.lmdb import clip_key
from loaders import ClipDataset, open_clips
from train.main import main, run_argv

from .loaders_fixtures import copy_conversion, rewrite_value
from .train_fixtures import common, final_state, one_line_error, tiny_data  # noqa: F401

# 40 clips at batch 8: one epoch reads every clip once.
EPOCH = ["--epochs", "1", "--batch-size", "8"]


@pytest.fixture(scope="module")
def damaged(tiny_data, tmp_path_factory):  # noqa: F811
    """A copy of the tiny set whose clip 13 has the last byte of its payload (one pixel's blue) flipped."""
    store = open_clips(tiny_data)
    shards, refs = store.refs([13])
    shard, (video, clip) = int(shards[0]), refs[0]
    root = copy_conversion(tiny_data, str(tmp_path_factory.mktemp("damaged") / "clips"))
    shard_path = os.path.join(root, os.path.relpath(store.shard_paths[shard], store.root))
    rewrite_value(shard_path, clip_key(video, clip), lambda v: v[:-1] + bytes([v[-1] ^ 0xFF]))
    return {"root": root, "shard": shard_path, "video": video, "clip": clip,
            "original": store.get(13).clip.copy()}


def test_flipped_payload_byte_read_plainly_and_caught_by_raw_training_even_without_the_option(damaged, tmp_path,
                                                                                             capsys):
    got = open_clips(damaged["root"]).get(13).clip
    original = damaged["original"]
    assert np.flatnonzero(got != original).tolist() == [original.size - 1]  # one value differs: the last
    assert int(got.flat[-1]) == int(original.flat[-1]) ^ 0xFF
    # The tiny set is raw, whose crops check the CRC always (RawCodec.crc_on_crop): the default run stops too.
    assert main(common(damaged["root"], tmp_path / "run") + EPOCH) == 2
    err = one_line_error(capsys)
    key = clip_key(damaged["video"], damaged["clip"]).decode()
    assert err.startswith(f"--data {damaged['root']}: {damaged['shard']}: {key}: payload crc32 "), err
    assert not os.path.exists(tmp_path / "run" / "checkpoint.pt")


@pytest.mark.parametrize("loader, workers", [("threads", "2"), ("processes", "1"), ("dali", "0")])
def test_verify_data_stops_at_the_damaged_clip_naming_shard_and_clip(damaged, tmp_path, capsys, loader, workers):
    if loader == "dali":
        pytest.importorskip("nvidia.dali")
    argv = common(damaged["root"], tmp_path / "run") + EPOCH + ["--verify-data", "--loader", loader,
                                                                "--workers", workers]
    assert main(argv) == 2
    err = one_line_error(capsys)
    root = damaged["root"]
    key = clip_key(damaged["video"], damaged["clip"]).decode()
    assert err.startswith(f"--data {root}: {damaged['shard']}: {key}: payload crc32 "), err
    assert err.endswith(f"(python -m convert verify {root} checks the shards for damage)")
    assert not os.path.exists(tmp_path / "run" / "checkpoint.pt")  # stopped inside the epoch, before its save


class _DiesInWorker(ClipDataset):
    """A Dataset whose DataLoader worker processes kill themselves with ``signum`` on their first batch."""

    signum = signal.SIGSEGV

    def __getitems__(self, items):
        if get_worker_info() is not None:
            os.kill(os.getpid(), self.signum)
        return super().__getitems__(items)


@pytest.mark.parametrize("signum", [signal.SIGSEGV, signal.SIGBUS], ids=["SIGSEGV", "SIGBUS"])
def test_loader_worker_killed_by_a_signal_is_one_line(tiny_data, tmp_path, capsys, monkeypatch, signum):  # noqa: F811
    dies = type("Dies", (_DiesInWorker,), {"signum": signum})
    monkeypatch.setattr(train.data, "ClipDataset", dies)
    assert main(common(tiny_data, tmp_path / "run") + EPOCH + ["--loader", "processes", "--workers", "1"]) == 2
    err = one_line_error(capsys)
    expected = (rf"a loader worker process \(pid \d+\) was killed by {signum.name} while reading --data "
                rf"{re.escape(tiny_data)}: python -m convert verify {re.escape(tiny_data)} checks the shards for "
                rf"damage; the other usual cause is a too-small /dev/shm \(docker run --shm-size 8g; or use "
                rf"--loader threads, which needs none\)")
    assert re.fullmatch(expected, err), err
