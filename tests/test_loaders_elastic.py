"""Elastic resume in the loaders: an epoch begun on W ranks and finished on W' ranks (and another per-rank batch
with the same global batch) reads every clip of the epoch exactly once, with the crops of an unbroken epoch.

Each loader the trainer builds is tried: reader threads and DataLoader worker processes (``build_loader``,
the sampler holding the position) and DALI's source route (its own position, the sampler's order), on the
40-clip conversion of the trainer tests; DALI's CPU backend. The ranks of one run are loaders of the same
process here (the order a rank reads is a function of its rank and the world size alone); the trainer test
(tests/test_train_elastic.py) runs them as real gloo processes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator

import numpy as np
import pytest
import torch

from loaders import ClipDataset, ClipPreset, DistributedClipSampler, build_loader
from loaders.sampler import elastic_position

from .train_fixtures import tiny_data  # noqa: F401

SEED, EPOCH, N = 5, 1, 40


class _Rank:
    """One rank's loader and what holds its position (the sampler, or the DALI loader itself)."""

    def __init__(self, loader, position) -> None:
        self.loader, self.position = loader, position

    def batches(self) -> Iterator[dict]:
        return iter(self.loader)

    def close(self) -> None:
        close = getattr(self.loader, "close", None)
        if close is not None:
            close()


def _sampler_rank(root: str, kind: str) -> Callable[[int, int, int], _Rank]:
    preset = ClipPreset(train=True, crop_size=32, seed=SEED)
    ds = ClipDataset(root, train=True, preset=preset, seed=SEED)

    def make(rank: int, world: int, batch: int) -> _Rank:
        sampler = DistributedClipSampler(N, num_replicas=world, rank=rank, seed=SEED, drop_last=True)
        readers = {"threads": 2} if kind == "threads" else {"workers": 1, "persistent_workers": False}
        loader = build_loader(ds, batch_size=batch, sampler=sampler, train=True, drop_last=True, pin_memory=False,
                              **readers)
        return _Rank(loader, sampler)

    return make


def _dali_rank(root: str) -> Callable[[int, int, int], _Rank]:
    pytest.importorskip("nvidia.dali")
    from loaders.dali import DaliClipLoader

    preset = ClipPreset(train=True, crop_size=32, seed=SEED)

    def make(rank: int, world: int, batch: int) -> _Rank:
        loader = DaliClipLoader(root, train=True, batch_size=batch, preset=preset, rank=rank, world_size=world,
                                seed=SEED, workers=0)
        return _Rank(loader, loader)

    return make


def _halves(make: Callable[[int, int, int], _Rank], before: tuple[int, int], after: tuple[int, int],
            steps: int) -> tuple[dict[int, list[torch.Tensor]], list[dict]]:
    """Read ``steps`` batches of epoch EPOCH on every rank of (world, batch) ``before``, save each rank's
    position, then the rest of the epoch on every rank of ``after`` from rank 0's saved state (the one the
    trainer saves). Returns every crop read, by clip index, and the saved states."""
    crops: dict[int, list[torch.Tensor]] = {}
    (world, batch), states = before, []
    for rank in range(world):
        r = make(rank, world, batch)
        r.position.set_epoch(EPOCH)
        it = r.batches()
        for _ in range(steps):
            b = next(it)
            for k, i in enumerate(b["index"].tolist()):
                crops.setdefault(i, []).append(b["clip"][k].clone())
        states.append(r.position.state_dict(consumed=steps * batch))
        r.close()
    world, batch = after
    for rank in range(world):
        r = make(rank, world, batch)
        r.position.load_state_dict(states[0])
        r.position.set_epoch(EPOCH)  # the trainer's loop: the same epoch keeps the position
        for b in r.batches():
            for k, i in enumerate(b["index"].tolist()):
                crops.setdefault(i, []).append(b["clip"][k].clone())
        r.close()
    return crops, states


def _whole_epoch(make: Callable[[int, int, int], _Rank], batch: int) -> dict[int, torch.Tensor]:
    r = make(0, 1, batch)
    r.position.set_epoch(EPOCH)
    out = {i: b["clip"][k].clone() for b in r.batches() for k, i in enumerate(b["index"].tolist())}
    r.close()
    return out


CASES = [
    # (world, batch) before and after, and the steps read before the stop: 40 clips, so 40 // global batch
    # steps per epoch on either side (same global batch).
    pytest.param((2, 4), (1, 8), 2, id="W2-to-W1"),
    pytest.param((1, 8), (2, 4), 2, id="W1-to-W2"),
    pytest.param((2, 3), (1, 6), 3, id="W2-to-W1-partial-last-batch"),  # 40 clips: 6 steps of 6, 4 dropped
]


@pytest.mark.parametrize("kind", ["threads", "processes", "dali-source"])
@pytest.mark.parametrize("before, after, steps", CASES)
def test_an_epoch_continued_on_another_rank_count_reads_every_clip_once(tiny_data, kind, before,  # noqa: F811
                                                                         after, steps):
    make = _dali_rank(tiny_data) if kind == "dali-source" else _sampler_rank(tiny_data, kind)
    crops, states = _halves(make, before, after, steps)
    global_batch = before[0] * before[1]
    assert global_batch == after[0] * after[1]
    # Every rank of the first run stands at the same global position: steps x the global batch.
    assert {s["global_position"] for s in states} == {steps * global_batch}
    assert {s["world_size"] for s in states} == {before[0]}
    assert elastic_position(states[0], after[0]) == steps * global_batch // after[0]
    # The epoch's global order does not depend on the rank count: its first (steps per epoch x global batch)
    # clips are read, each exactly once over the two runs.
    epoch = DistributedClipSampler(N, num_replicas=1, rank=0, seed=SEED, drop_last=True).global_order(EPOCH)
    want = epoch[:N // global_batch * global_batch].tolist()
    assert Counter({i: len(c) for i, c in crops.items()}) == Counter(want)
    # ... with the crop and flip an unbroken one-rank epoch cuts (keyed by seed, epoch and index).
    whole = _whole_epoch(make, global_batch)
    for i, (crop,) in crops.items():
        assert torch.equal(crop, whole[i]), i


def test_a_state_of_another_rank_count_resumes_at_its_global_position():
    eight = DistributedClipSampler(64, num_replicas=8, rank=3, seed=1, drop_last=True)
    state = eight.state_dict(consumed=3)
    assert (state["position"], state["world_size"], state["global_position"]) == (3, 8, 24)
    for world in (1, 2, 3, 4, 6, 12):
        ranks = [DistributedClipSampler(64, num_replicas=world, rank=r, seed=1, drop_last=True)
                 for r in range(world)]
        for r in ranks:
            r.load_state_dict(state)
        assert {r.global_position for r in ranks} == {24} and {r.position for r in ranks} == {24 // world}
        rest = np.concatenate([np.asarray(list(r))[:, 1] for r in ranks])
        glob = ranks[0].global_order(0)
        assert sorted(rest.tolist()) == sorted(glob[24:].tolist())
    with pytest.raises(ValueError, match="global position 24 cannot resume on 5 rank"):
        DistributedClipSampler(64, num_replicas=5, rank=0, seed=1).load_state_dict(state)
    # A state written before states recorded the world size is this run's own.
    old = DistributedClipSampler(64, num_replicas=2, rank=0, seed=1)
    old.load_state_dict({"epoch": 0, "position": 5, "scheme": 2})
    assert old.position == 5 and old.global_position == 10
