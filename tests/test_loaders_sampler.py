"""DistributedClipSampler: disjoint equal rank shares, per-epoch order, exact resume, balance."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from loaders import DistributedClipSampler


def _ranks(n, world=2, **kw) -> list[DistributedClipSampler]:
    return [DistributedClipSampler(n, num_replicas=world, rank=r, **kw) for r in range(world)]


def test_two_ranks_see_every_clip_once_per_epoch_disjointly():
    n = 40
    ranks = _ranks(n, seed=7)
    orders = []
    for epoch in range(4):
        shares = []
        for s in ranks:
            s.set_epoch(epoch)
            got = list(s)
            assert all(e == epoch for e, _ in got)  # (epoch, index) tuples
            shares.append([i for _, i in got])
        assert [len(x) for x in shares] == [20, 20] == [len(s) for s in ranks]
        assert not set(shares[0]) & set(shares[1])
        assert sorted(shares[0] + shares[1]) == list(range(n))
        orders.append(shares[0] + shares[1])
    assert len({tuple(o) for o in orders}) == 4  # every epoch reshuffles


def test_same_seed_same_order_other_seed_other_order():
    a = DistributedClipSampler(30, num_replicas=1, rank=0, seed=3, with_epoch=False)
    b = DistributedClipSampler(30, num_replicas=1, rank=0, seed=3, with_epoch=False)
    c = DistributedClipSampler(30, num_replicas=1, rank=0, seed=4, with_epoch=False)
    for s in (a, b, c):
        s.set_epoch(2)
    assert list(a) == list(b) and list(a) != list(c)
    assert all(isinstance(i, int) for i in a)
    assert sorted(a) == list(range(30))


def test_padding_by_wrapping_and_drop_last():
    ranks = _ranks(11, world=3, shuffle=False)
    shares = [list(s) for s in ranks]
    assert [len(s) for s in ranks] == [4, 4, 4]
    flat = [i for sh in shares for _, i in sh]
    assert sorted(Counter(flat).values()) == [1] * 10 + [2]  # 12 slots: one clip twice
    assert set(flat) == set(range(11))
    assert [i for _, i in shares[0]] == [0, 3, 6, 9]  # round-robin, as DistributedSampler deals
    dropped = _ranks(11, world=3, shuffle=False, drop_last=True)
    assert [len(s) for s in dropped] == [3, 3, 3]
    flat = [i for s in dropped for _, i in s]
    assert len(flat) == len(set(flat)) == 9


def test_resume_mid_epoch_gives_the_same_remaining_order():
    full = DistributedClipSampler(50, num_replicas=2, rank=1, seed=11)
    full.set_epoch(3)
    order = list(full)
    # the trainer saves what it consumed (prefetch runs ahead, so the sampler cannot know)
    state = full.state_dict(consumed=9)
    assert state == {"epoch": 3, "position": 9}
    fresh = DistributedClipSampler(50, num_replicas=2, rank=1, seed=11)
    fresh.load_state_dict(state)
    fresh.set_epoch(3)  # the usual epoch loop: same epoch keeps the position
    assert list(fresh) == order[9:]
    assert list(fresh) == order[9:]  # stays until the epoch changes
    assert fresh.state_dict() == {"epoch": 3, "position": 9}
    fresh.set_epoch(4)
    nxt = list(fresh)
    assert len(nxt) == 25 and nxt[0][0] == 4 and fresh.state_dict()["position"] == 0
    fresh.set_position(25)
    assert list(fresh) == []
    with pytest.raises(ValueError, match="position must be in 0..25"):
        fresh.set_position(26)


def test_balanced_sampling_equalises_a_skewed_label_set():
    labels = np.array([0] * 800 + [1] * 150 + [2] * 50)
    s = DistributedClipSampler(labels, num_replicas=1, rank=0, balanced=True, seed=5, with_epoch=False)
    counts = np.zeros(3, int)
    for epoch in range(3):
        s.set_epoch(epoch)
        drawn = list(s)
        assert len(drawn) == 1000
        counts += np.bincount(labels[drawn], minlength=3)
    # each class about a third of 3000 draws, instead of 80% / 15% / 5%
    assert counts.sum() == 3000
    assert all(900 < c < 1100 for c in counts), counts
    s.set_epoch(1)
    again = list(s)
    s2 = DistributedClipSampler(labels, num_replicas=1, rank=0, balanced=True, seed=5, with_epoch=False)
    s2.set_epoch(1)
    assert list(s2) == again  # deterministic from (seed, epoch)
    s2.set_epoch(2)
    assert list(s2) != again


def test_balanced_shares_split_over_ranks():
    labels = np.array([0] * 90 + [1] * 10)
    ranks = _ranks(labels, world=2, balanced=True, seed=1, epoch_size=400)
    a, b = ([i for _, i in s] for s in ranks)
    assert len(a) == len(b) == 200
    both = np.concatenate([a, b])
    assert 170 < np.sum(labels[both] == 1) < 230


def test_sampler_validates_its_arguments():
    with pytest.raises(ValueError, match="rank must be in 0..1"):
        DistributedClipSampler(10, num_replicas=2, rank=2)
    with pytest.raises(ValueError, match="needs the labels"):
        DistributedClipSampler(10, balanced=True)
    with pytest.raises(ValueError, match="keys epoch and position"):
        DistributedClipSampler(10).load_state_dict({"epoch": 1})
    s = DistributedClipSampler(10)
    assert (s.num_replicas, s.rank) == (1, 0)  # no process group: one rank
    assert len(s) == 10
