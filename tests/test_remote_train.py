"""Training from ``s3://`` shards: the same batches as from the local folder, through every loader; a server that
goes away mid-epoch stops the run in one line, and ``--resume`` continues once it is back."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest
import torch

from train import checkpoint as ckpt_io
from train.main import main, run_argv

from .remote_fixtures import cache_of
from .train_fixtures import assert_states_equal, common, final_state, one_line_error, tiny_data, tiny_tfrecord

# 40 clips, batch 8: 5 steps per epoch.
ARGS = ["--batch-size", "8", "--optimizer", "adamw", "--lr", "1e-3", "--epochs", "1", "--ckpt-every", "1"]


def _cache(tmp_path, name: str = "cache") -> list[str]:
    return ["--cache-dir", str(tmp_path / name)]


@pytest.mark.parametrize("loader", [["--loader", "threads", "--workers", "2"], ["--loader", "processes",
                                                                                 "--workers", "1"]])
def test_training_from_s3_equals_local(s3_server, tiny_data, tmp_path, loader):
    url = s3_server.upload(tiny_data, s3_server.bucket())
    run_argv(common(tiny_data, tmp_path / "local") + ARGS + loader + ["--max-steps", "3"])
    run_argv(common(url, tmp_path / "s3") + ARGS + loader + ["--max-steps", "3"] + _cache(tmp_path))
    assert_states_equal(final_state(tmp_path / "local")["model"], final_state(tmp_path / "s3")["model"])


def test_dali_routes_from_s3_equal_local(s3_server, tiny_data, tiny_tfrecord, tmp_path):
    from loaders import dali

    if dali.missing() is not None:
        pytest.skip(f"DALI not usable: {dali.missing()}")
    from convert.store.cache import CacheSettings
    from loaders.dali import DaliClipLoader, DaliTFRecordLoader

    for root, cls in ((tiny_data, DaliClipLoader), (tiny_tfrecord, DaliTFRecordLoader)):
        url = s3_server.upload(root, s3_server.bucket())
        cache = CacheSettings(cache_dir=str(tmp_path / "dali"))
        from loaders import ClipPreset

        kw = {"train": True, "batch_size": 8, "preset": ClipPreset(train=True, crop_size=32, seed=3)}
        if cls is DaliClipLoader:
            kw["workers"] = 0
        local, remote = cls(root, **kw), cls(url, cache=cache, **kw)
        try:
            for a, b in zip(local, remote):
                assert torch.equal(a["clip"], b["clip"]) and torch.equal(a["label"], b["label"])
                assert a["video_id"] == b["video_id"]
        finally:
            local.close()
            remote.close()


def test_server_gone_mid_epoch_then_resume(s3_server, tiny_data, tmp_path, capsys):
    """A cache that holds 3 of the 4 shards makes every epoch download as it goes; the server stops after the
    first step of a run of two epochs (the second epoch must download at least one shard again, however far the
    first one's reads and prefetches got before the stop): the loader retries, then the run ends in one line
    naming the URL; restarted, --resume ends where an unbroken local run ends."""
    # The session's server: a server of its own would not do, as s3fs keeps one file system per set of
    # options in the process, made with the endpoint of its time (and moto's buckets are shared by all its
    # servers in a process: the run would read on from the first server).
    own = s3_server
    url = own.upload(tiny_data, own.bucket())
    from convert.store import open_clips
    from convert.store.cache import CacheSettings

    probe = open_clips(url, cache=CacheSettings(cache_dir=str(tmp_path / "probe")))
    limit = 3 * max(cache_of(probe).sizes)
    assert limit < sum(cache_of(probe).sizes)
    probe.close()
    args = ARGS + ["--epochs", "2"]
    run_argv(common(tiny_data, tmp_path / "local") + args)
    out = tmp_path / "s3"
    argv = common(url, out) + args + _cache(tmp_path) + ["--cache-limit", str(limit)]
    stopper_done = threading.Event()

    def stop_after_first_step() -> None:
        # Any step's checkpoint: the step-1 file itself may be gone already (--keep-last) when a poll comes.
        while not (os.path.isdir(out) and ckpt_io.step_files(str(out))):
            time.sleep(0.01)
        own.stop()
        stopper_done.set()

    threading.Thread(target=stop_after_first_step, daemon=True).start()
    capsys.readouterr()
    try:
        code = main(argv)
    finally:
        stopper_done.wait(30)
        own.start()
    captured = capsys.readouterr().err
    assert code != 0, captured
    # The trainer's one error line (the stopped server's own thread may log its shutdown to stderr too).
    errors = [line for line in captured.splitlines() if line.startswith("train: error: ")]
    assert len(errors) == 1, captured
    err = errors[0]
    assert url in err and "failed" in err and "--resume" in err and "at step" in err, err
    run_argv(argv + ["--resume"])
    assert_states_equal(final_state(tmp_path / "local")["model"], final_state(out)["model"])


def test_a_cache_limit_below_the_largest_shard_is_one_line(s3_server, tiny_data, tmp_path, capsys):
    url = s3_server.upload(tiny_data, s3_server.bucket())
    assert main(common(url, tmp_path / "run") + ARGS + _cache(tmp_path) + ["--cache-limit", "1000"]) != 0
    err = one_line_error(capsys)
    assert url in err and "cache limit 1000 bytes" in err and "--cache-limit" in err, err
