"""Elastic resume in the loaders: an epoch begun on W ranks and finished on W' ranks (and another per-rank batch
with the same global batch) reads every clip of the epoch exactly once, with the crops of an unbroken epoch;
samples of videos (a SampleSpec's windows) too, with the frames of an unbroken epoch.

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
from loaders.sampling import SampleSpec

from .train_fixtures import tiny_data, tiny_tfrecord  # noqa: F401

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


def _sampler_rank(root: str, kind: str, spec: SampleSpec | None = None) -> Callable[[int, int, int], _Rank]:
    preset = ClipPreset(train=True, crop_size=32, seed=SEED)
    ds = ClipDataset(root, train=True, preset=preset, seed=SEED, spec=spec)
    if len(ds) != N:
        raise ValueError(f"the cases assume {N} samples an epoch, got {len(ds)}")

    def make(rank: int, world: int, batch: int) -> _Rank:
        sampler = DistributedClipSampler(N, num_replicas=world, rank=rank, seed=SEED, drop_last=True)
        readers = {"threads": 2} if kind == "threads" else {"workers": 1, "persistent_workers": False}
        loader = build_loader(ds, batch_size=batch, sampler=sampler, train=True, drop_last=True, pin_memory=False,
                              **readers)
        return _Rank(loader, sampler)

    return make


def _dali_rank(root: str, spec: SampleSpec | None = None) -> Callable[[int, int, int], _Rank]:
    pytest.importorskip("nvidia.dali")
    from loaders.dali import DaliClipLoader

    preset = ClipPreset(train=True, crop_size=32, seed=SEED)

    def make(rank: int, world: int, batch: int) -> _Rank:
        loader = DaliClipLoader(root, train=True, batch_size=batch, preset=preset, rank=rank, world_size=world,
                                seed=SEED, workers=0, spec=spec)
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


# Samples of videos (SampleSpec): 16 frames at step 2 from anywhere in each of the 20 videos, 2 per video per
# epoch: 40 samples, as the 40 stored clips.
WINDOWS = SampleSpec(frames=16, step=2, rule="window", clips_per_video=2)


@pytest.mark.parametrize("kind, spec", [("threads", None), ("processes", None), ("dali-source", None),
                                        ("threads", WINDOWS), ("dali-source", WINDOWS)],
                         ids=["threads", "processes", "dali-source", "threads-windows", "dali-source-windows"])
@pytest.mark.parametrize("before, after, steps", CASES)
def test_an_epoch_continued_on_another_rank_count_reads_every_clip_once(tiny_data, kind, spec, before,  # noqa: F811
                                                                         after, steps):
    make = _dali_rank(tiny_data, spec) if kind == "dali-source" else _sampler_rank(tiny_data, kind, spec)
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


def _native(root: str, rank: int, world: int, batch: int):
    pytest.importorskip("nvidia.dali")
    from loaders.dali.native import DaliTFRecordLoader

    return DaliTFRecordLoader(root, train=True, batch_size=batch, preset=ClipPreset(train=True, crop_size=32,
                                                                                     seed=SEED),
                              rank=rank, world_size=world, seed=SEED, threads=1)


def _real(batch: dict) -> list[int]:
    return batch["index"][~batch["padding"]].tolist()


@pytest.mark.parametrize("before, after", [((2, 4), (1, 8)), ((1, 8), (2, 4))], ids=["W2-to-W1", "W1-to-W2"])
def test_native_route_reads_the_rest_of_an_epoch_begun_on_another_rank_count_once(tiny_tfrecord, before,  # noqa: F811
                                                                                 after):
    """DALI's own reader deals an epoch by world size and batch, so its checkpoint cannot carry over: the merged
    state records which clips every rank read, and the new ranks read the others, in the sampler's order,
    through the source route; a save inside that rest resumes exactly too."""
    from loaders.dali.native import DaliTFRecordLoader

    (w0, b0), (w1, b1), steps = before, after, 2
    read: list[int] = []
    states = []
    for rank in range(w0):
        loader = _native(tiny_tfrecord, rank, w0, b0)
        loader.set_epoch(EPOCH)
        it = iter(loader)
        for _ in range(steps):
            read += _real(next(it))
        states.append(loader.state_dict(consumed=steps * b0))
        loader.close()
    assert all("dali" in st and "read" in st for st in states)
    merged = DaliTFRecordLoader.merge_rank_states(states)
    assert merged["dali"] == states[0]["dali"] and merged["global_position"] == steps * b0 * w0
    start = steps * b0 * w0 // (b1 * w1) * b1  # the trainer's position: whole steps of the new global batch
    resumed = []
    for rank in range(w1):
        loader = _native(tiny_tfrecord, rank, w1, b1)
        loader.load_state_dict(merged)
        loader.set_epoch(EPOCH)
        loader.set_position(start)
        batches = list(loader)
        assert len(batches) == loader.steps_per_epoch - start // b1  # every rank runs the same steps
        resumed.append(batches)
        read += [i for b in batches for i in _real(b)]
        loader.close()
    assert Counter(read) == Counter(range(N))  # every clip of the epoch once over the two runs
    # Stop again one batch into the rest and resume on the same ranks: still every clip once.
    again: list[int] = []
    states = []
    for rank in range(w1):
        loader = _native(tiny_tfrecord, rank, w1, b1)
        loader.load_state_dict(merged)
        loader.set_epoch(EPOCH)
        loader.set_position(start)
        first = next(iter(loader))
        assert torch.equal(first["clip"], resumed[rank][0]["clip"])  # the rest's crops: keyed, reproducible
        again += _real(first)
        states.append(loader.state_dict(consumed=start + b1))
        loader.close()
    later = DaliTFRecordLoader.merge_rank_states(states)
    assert "dali" not in later and "read" in later
    for rank in range(w1):
        loader = _native(tiny_tfrecord, rank, w1, b1)
        loader.load_state_dict(later)
        loader.set_epoch(EPOCH)
        again += [i for b in loader for i in _real(b)]
        loader.close()
    assert Counter(read[:steps * b0 * w0] + again) == Counter(range(N))


def test_merged_native_states_need_every_ranks_reads(tiny_tfrecord):  # noqa: F811
    from loaders.dali.native import DaliTFRecordLoader

    with pytest.raises(ValueError, match="needs the state of every rank"):
        DaliTFRecordLoader.merge_rank_states([])
    merged = DaliTFRecordLoader.merge_rank_states([{"epoch": 0, "position": 4, "read": "AA==:8"},
                                                   {"epoch": 0, "position": 4}])
    assert "read" not in merged
    loader = _native(tiny_tfrecord, 0, 1, 4)
    with pytest.raises(ValueError, match="not a packed mask"):
        loader.load_state_dict({"epoch": 0, "position": 4, "read": "nonsense"})
    with pytest.raises(ValueError, match="of 8 clips"):
        loader.load_state_dict({"epoch": 0, "position": 4, "read": "AA==:8"})
    loader.close()


def test_video_epochs_resume_on_another_rank_count_too():
    from loaders.sampler import VideoEpochSampler

    video = np.repeat(np.arange(30), 3)  # 30 videos of 3 clips, one clip of each per epoch
    three = [VideoEpochSampler(video, num_replicas=3, rank=r, seed=2, drop_last=True, with_epoch=False)
             for r in range(3)]
    read = [i for s in three for i in s.indices(4)[:4]]
    state = {**three[0].state_dict(consumed=4), "epoch": 4}
    two = [VideoEpochSampler(video, num_replicas=2, rank=r, seed=2, drop_last=True, with_epoch=False)
           for r in range(2)]
    for s in two:
        s.load_state_dict(state)
        read += list(s)
    assert Counter(i // 3 for i in read) == Counter(range(30))  # every video once, one clip of each
    assert sorted(read) == sorted(two[0].global_order(4).tolist())
