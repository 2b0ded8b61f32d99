"""Elastic resume in the trainer: a run stopped on W processes and resumed on W' (gloo, on the CPU) trains every
clip of the interrupted epoch exactly once over the two runs.

The processes are real: ``torch.multiprocessing`` starts one per rank with torchrun's environment (RANK,
WORLD_SIZE, MASTER_ADDR...), and each runs ``python -m train``'s ``run_argv`` under DDP with gloo (the
one-process side runs in the test's own process, as ``python -m train`` without torchrun does). Each rank
writes down the clip indices of every batch the training loop takes (the training data's iterator, wrapped
in the child), so the test sees what was trained on, not what the sampler would say.
"""

from __future__ import annotations

import json
import os
from collections import Counter

import pytest
import torch.multiprocessing as mp

from loaders import DistributedClipSampler
from train import checkpoint as ckpt_io

from .train_fixtures import as_torchrun_rank, common, final_state, free_port, tiny_data, tiny_tfrecord  # noqa: F401

SEED = 0


def _recording(rank: int, record: str):
    """``TrainData.__iter__`` that writes the clip indices of every batch the training loop takes to ``record``."""
    import train.data

    taken = train.data.TrainData.__iter__

    def recording(self):
        for batch in taken(self):
            with open(f"{record}.rank{rank}", "a") as f:
                f.write(json.dumps(batch["index"].tolist()) + "\n")
            yield batch

    return recording


def _rank_main(rank: int, world: int, port: int, argv: list[str], record: str) -> None:
    """One rank: torchrun's environment, the training data's batches written to ``record``, then the trainer."""
    as_torchrun_rank(rank, world, port)
    import train.data
    from train.main import run_argv

    train.data.TrainData.__iter__ = _recording(rank, record)  # type: ignore[method-assign]
    run_argv(argv)


def _train(world: int, argv: list[str], record: str, monkeypatch) -> None:
    """``python -m train ARGV`` on ``world`` gloo processes (one: in this process, no process group)."""
    if world > 1:
        mp.start_processes(_rank_main, args=(world, free_port(), argv, record), nprocs=world, start_method="spawn")
        return
    import train.data
    from train.main import run_argv

    with monkeypatch.context() as m:
        m.setattr(train.data.TrainData, "__iter__", _recording(0, record))
        run_argv(argv)


def _read(record: str, world: int) -> list[list[int]]:
    batches = []
    for rank in range(world):
        path = f"{record}.rank{rank}"
        if os.path.exists(path):
            with open(path) as f:
                batches += [json.loads(line) for line in f]
    return batches


@pytest.mark.parametrize("before, after", [((2, 4), (1, 8)), ((1, 8), (2, 4))], ids=["W2-to-W1", "W1-to-W2"])
def test_resume_on_another_number_of_processes_trains_every_clip_of_the_epoch_once(tiny_data, tmp_path,  # noqa: F811
                                                                                   before, after, capfd,
                                                                                   monkeypatch):
    """40 clips, global batch 8: 5 steps per epoch. Stop after 2 steps on W processes, resume on W' to the end of
    the epoch: the two runs together took every clip of epoch 0 once, and the checkpoints record where."""
    out = tmp_path / "run"
    args = ["--epochs", "1", "--optimizer", "sgd", "--lr", "0.01", "--eval-every", "0", "--workers", "1"]
    (w0, b0), (w1, b1) = before, after
    _train(w0, common(tiny_data, out) + args + ["--batch-size", str(b0), "--max-steps", "2"], str(tmp_path / "a"),
           monkeypatch)
    mid = final_state(out)
    assert (mid["step"], mid["epoch"], mid["epoch_step"]) == (2, 0, 2)
    assert mid["sampler"] == {"epoch": 0, "position": 2 * b0, "world_size": w0, "global_position": 16,
                              "scheme": 2, "global_batch": 8}
    capfd.readouterr()
    _train(w1, common(tiny_data, out) + args + ["--batch-size", str(b1), "--resume"], str(tmp_path / "b"),
           monkeypatch)
    printed = capfd.readouterr().out
    assert f"processes {w0} -> {w1}" in printed and f"--batch-size {b0} -> {b1}" in printed
    assert f"note: {w0} -> {w1} process(es)" in printed and "epoch 1 goes on at sample 16 of its order" in printed
    first, second = _read(str(tmp_path / "a"), w0), _read(str(tmp_path / "b"), w1)
    assert [len(b) for b in first] == [b0] * 2 * w0 and [len(b) for b in second] == [b1] * 3 * w1
    taken = Counter(i for b in first + second for i in b)
    epoch0 = DistributedClipSampler(40, num_replicas=1, rank=0, seed=SEED, drop_last=True).global_order(0)
    assert taken == Counter(epoch0.tolist())  # every clip of the epoch, exactly once
    end = final_state(out)
    assert (end["step"], end["epoch"], end["epoch_step"]) == (5, 1, 0)
    assert end["config"]["world_size"] == w1 and len(end["rng"]) == w1
    assert end["sampler"]["world_size"] == w1 and end["sampler"]["position"] == 0
    assert ckpt_io.resume_problem(end) is None


def test_shard_order_option_builds_the_samplers_shard_windowed_order(tiny_data, tmp_path):  # noqa: F811
    """--order shards --order-shards K: the training sampler reads the conversion's shards K at a time."""
    from loaders import open_clips
    from loaders.sampler import clip_shards
    from train.data import build_train_data
    from train.dist import DistInfo

    from .train_fixtures import CPU, cpu_config

    cfg = cpu_config(common(tiny_data, tmp_path / "a") + ["--batch-size", "8", "--order", "shards",
                                                            "--order-shards", "1"])
    assert (cfg.order, cfg.order_shards) == ("shards", 1)
    data = build_train_data(cfg, DistInfo(0, 1, 0, CPU, None))
    shard_of = clip_shards(open_clips(tiny_data))
    want = DistributedClipSampler(40, num_replicas=1, rank=0, seed=cfg.seed, drop_last=True, order="shards",
                                  clip_shards=shard_of, shard_window=1)
    assert data.sampler.indices(1).tolist() == want.indices(1).tolist()
    read = shard_of[want.indices(1)].tolist()
    assert len(set(read)) == len(set(shard_of.tolist())) and read == sorted(read, key=read.index)  # one at a time
    data.close()


def test_native_dali_route_resumed_with_another_batch_trains_every_clip_once(tiny_tfrecord, tmp_path,  # noqa: F811
                                                                             monkeypatch, capfd):
    """--loader dali on a TFRecord conversion (DALI's own reader, its CPU backend): stopped after 2 steps of 8,
    resumed at batch 4, whose sharding DALI's checkpoint cannot restore. The checkpoint records the clips read,
    the rest of the epoch is read through the source route: every clip of the epoch once."""
    pytest.importorskip("nvidia.dali")
    out = tmp_path / "run"
    args = ["--epochs", "1", "--optimizer", "sgd", "--lr", "0.01", "--eval-every", "0", "--loader", "dali",
            "--workers", "1"]
    _train(1, common(tiny_tfrecord, out) + args + ["--batch-size", "8", "--max-steps", "2"], str(tmp_path / "a"),
           monkeypatch)
    mid = final_state(out)
    assert mid["sampler"]["global_position"] == 16 and "read" in mid["sampler"] and "dali" in mid["sampler"]
    capfd.readouterr()
    _train(1, common(tiny_tfrecord, out) + args + ["--batch-size", "4", "--resume"], str(tmp_path / "b"),
           monkeypatch)
    printed = capfd.readouterr().out
    assert "epoch 1 goes on at sample 16 of its order (4 steps in)" in printed
    assert "reads the clips of the epoch not read yet through the source route" in printed
    first, second = _read(str(tmp_path / "a"), 1), _read(str(tmp_path / "b"), 1)
    assert [len(b) for b in first] == [8, 8] and [len(b) for b in second] == [4] * 6
    assert Counter(i for b in first + second for i in b) == Counter(range(40))
    assert final_state(out)["step"] == 8
