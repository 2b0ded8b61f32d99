"""DistributedClipSampler: disjoint equal rank shares, per-epoch order, exact resume, the keyed order scheme."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from loaders import DistributedClipSampler
from loaders.sampler import VideoEpochSampler


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
    assert state == {"epoch": 3, "position": 9, "world_size": 2, "global_position": 18, "scheme": 2}
    fresh = DistributedClipSampler(50, num_replicas=2, rank=1, seed=11)
    fresh.load_state_dict(state)
    fresh.set_epoch(3)  # the usual epoch loop: same epoch keeps the position
    assert list(fresh) == order[9:]
    assert list(fresh) == order[9:]  # stays until the epoch changes
    assert fresh.state_dict() == {"epoch": 3, "position": 9, "world_size": 2, "global_position": 18, "scheme": 2}
    fresh.set_epoch(4)
    nxt = list(fresh)
    assert len(nxt) == 25 and nxt[0][0] == 4 and fresh.state_dict()["position"] == 0
    fresh.set_position(25)
    assert list(fresh) == []
    with pytest.raises(ValueError, match="position must be in 0..25"):
        fresh.set_position(26)


def test_the_epoch_order_is_drawn_with_the_keyed_generator():
    """Scheme 2: the permutation sorts keyed_uniform((seed, epoch, 0), i) over i (ties in index order), a
    function of (seed, epoch) defined in loaders.keyed, not of numpy's generators."""
    from loaders.keyed import keyed_uniform

    s = DistributedClipSampler(40, num_replicas=1, rank=0, seed=3, with_epoch=False)
    s.set_epoch(4)
    want = np.argsort(keyed_uniform((3, 4, 0), np.arange(40, dtype=np.uint64)), kind="stable")
    assert list(s) == want.tolist()
    assert list(s) != np.random.default_rng((3, 4)).permutation(40).tolist()
    assert list(s)[:8] == [13, 6, 31, 36, 3, 30, 4, 11]  # pinned: the scheme is part of the format of a run


def test_a_state_without_a_scheme_is_the_keyed_one_and_the_retired_numpy_scheme_is_refused():
    """Scheme 1 (numpy's draws) was retired before the first release: a state naming it is refused in one line;
    a state without "scheme" (made by hand) draws the keyed order."""
    s = DistributedClipSampler(40, num_replicas=1, rank=0, seed=3, with_epoch=False)
    s.load_state_dict({"epoch": 4, "position": 5})
    fresh = DistributedClipSampler(40, num_replicas=1, rank=0, seed=3, with_epoch=False)
    fresh.set_epoch(4)
    assert s.state_dict()["scheme"] == 2 and list(s) == list(fresh)[5:]
    for scheme in (1, 7):
        with pytest.raises(ValueError, match=f"sampler state has scheme {scheme}; this sampler draws with \\(2,\\)"):
            s.load_state_dict({"epoch": 0, "position": 0, "scheme": scheme})


def test_sampler_validates_its_arguments():
    with pytest.raises(ValueError, match="rank must be in 0..1"):
        DistributedClipSampler(10, num_replicas=2, rank=2)
    with pytest.raises(ValueError, match="must be the dataset size"):
        DistributedClipSampler(np.zeros(10))
    with pytest.raises(ValueError, match="keys epoch and position"):
        DistributedClipSampler(10).load_state_dict({"epoch": 1})
    s = DistributedClipSampler(10)
    assert (s.num_replicas, s.rank) == (1, 0)  # no process group: one rank
    assert len(s) == 10


# -- VideoEpochSampler: an epoch is a pass over videos ---------------------------------------------------

# 10 videos of 3, 1, 5, 2, 4, 6, 2, 3, 1, 4 clips (31 clips).
COUNTS = [3, 1, 5, 2, 4, 6, 2, 3, 1, 4]
VIDEO_INDEX = np.repeat(np.arange(len(COUNTS)), COUNTS)


def _video_ranks(world=2, **kw):
    from loaders import sampler as sampler_module

    return [sampler_module.VideoEpochSampler(VIDEO_INDEX, num_replicas=world, rank=r, **kw) for r in range(world)]


@pytest.mark.parametrize("k", [1, 2])
def test_video_epochs_cover_each_video_k_times_across_two_ranks(k):
    ranks = _video_ranks(clips_per_video=k, seed=5)
    assert [len(s) for s in ranks] == [5 * k, 5 * k]  # 10 videos x k over 2 ranks, nothing padded
    for epoch in range(3):
        clips = []
        for s in ranks:
            s.set_epoch(epoch)
            got = list(s)
            assert all(e == epoch for e, _ in got)
            clips += [i for _, i in got]
        per_video = Counter(int(VIDEO_INDEX[i]) for i in clips)
        assert per_video == {v: k for v in range(len(COUNTS))}  # every video exactly k times
        for v, count in enumerate(COUNTS):  # distinct clips of the video where it has k
            mine = [i for i in clips if VIDEO_INDEX[i] == v]
            assert len(set(mine)) == min(k, count)


def test_video_epochs_choose_other_clips_each_epoch_and_resume_exactly():
    (s,) = _video_ranks(world=1, clips_per_video=1, seed=5, with_epoch=False)
    picks = [s.chosen(e)[:, 0].tolist() for e in range(4)]
    assert len({tuple(p) for p in picks}) == 4  # different clips per epoch
    assert len({p[5] for p in picks}) > 1  # the 6-clip video gets different clips
    assert all(p[1] == 3 for p in picks)  # the 1-clip video always gives its only clip
    # The choice of a video depends on (seed, epoch, video) only: the same for one rank or two.
    two = _video_ranks(world=2, clips_per_video=1, seed=5)
    assert np.array_equal(two[0].chosen(2), s.chosen(2))
    # Exact resume: from position 3 the rest of the epoch, and state_dict round trip.
    s.set_epoch(2)
    full = list(s)
    s.set_position(3)
    assert list(s) == full[3:]
    state = s.state_dict()
    (t,) = _video_ranks(world=1, clips_per_video=1, seed=5, with_epoch=False)
    t.load_state_dict(state)
    assert list(t) == full[3:]


def test_video_epochs_drop_last_and_padding_as_the_clip_sampler():
    dropped = _video_ranks(world=3, clips_per_video=1, seed=1, drop_last=True)
    assert [len(s) for s in dropped] == [3, 3, 3]  # 10 videos: 9 used, cut like DistributedClipSampler
    padded = _video_ranks(world=3, clips_per_video=1, seed=1)
    assert [len(s) for s in padded] == [4, 4, 4]
    flat = [i for s in padded for _, i in s]
    assert sorted(Counter(int(VIDEO_INDEX[i]) for i in flat).values()) == [1] * 8 + [2] * 2


# -- order="blocks": the block-shuffled order for shards larger than memory ---------------------------------

def _blocks_sampler(n, storage, world=1, rank=0, **kw) -> DistributedClipSampler:
    return DistributedClipSampler(n, num_replicas=world, rank=rank, seed=5, with_epoch=False, order="blocks",
                                  storage_order=storage, **kw)


def test_block_order_reads_each_window_of_blocks_together_and_every_clip_once():
    n, block, window = 96, 4, 3
    storage = np.random.default_rng(1).permutation(n)  # where the clips lie: any permutation
    blocks = [set(storage[b:b + block].tolist()) for b in range(0, n, block)]
    s = _blocks_sampler(n, storage, block=block, window=window)
    orders = []
    for epoch in range(3):
        s.set_epoch(epoch)
        got = list(s)
        assert sorted(got) == list(range(n))  # every clip once
        run = block * window
        for k in range(0, n, run):
            chunk = set(got[k:k + run])
            used = [b for b in blocks if b & chunk]
            assert len(used) == window and set().union(*used) == chunk  # exactly `window` whole blocks
        orders.append(got)
    assert len({tuple(o) for o in orders}) == 3
    again = _blocks_sampler(n, storage, block=block, window=window)
    again.set_epoch(2)
    assert list(again) == orders[2]  # a function of (seed, epoch) alone


def test_block_order_over_two_ranks_is_disjoint_and_resumes_exactly():
    n = 50
    storage = np.arange(n)[::-1].copy()
    ranks = [_blocks_sampler(n, storage, world=2, rank=r, block=5, window=2) for r in range(2)]
    for s in ranks:
        s.set_epoch(1)
    shares = [list(s) for s in ranks]
    assert [len(x) for x in shares] == [25, 25] and sorted(shares[0] + shares[1]) == list(range(n))
    resumed = _blocks_sampler(n, storage, world=2, rank=1, block=5, window=2)
    resumed.load_state_dict({"epoch": 1, "position": 9, "scheme": 2})
    assert list(resumed) == shares[1][9:]


def test_random_order_is_unchanged_by_the_order_setting():
    from loaders.keyed import keyed_uniform

    s = DistributedClipSampler(40, num_replicas=1, rank=0, seed=3, with_epoch=False)
    s.set_epoch(4)
    assert list(s) == np.argsort(keyed_uniform((3, 4, 0), np.arange(40, dtype=np.uint64)), kind="stable").tolist()


def test_block_order_keeps_the_clips_and_video_epochs():
    storage = np.arange(36)
    plain = DistributedClipSampler(36, num_replicas=1, rank=0, seed=2, with_epoch=False)
    blocky = DistributedClipSampler(36, num_replicas=1, rank=0, seed=2, with_epoch=False,
                                    order="blocks", storage_order=storage, block=4, window=2)
    assert sorted(plain) == sorted(blocky) and list(plain) != list(blocky)  # the same clips, reordered
    video = np.repeat(np.arange(12), 3)
    a = VideoEpochSampler(video, clips_per_video=2, num_replicas=1, rank=0, seed=4, with_epoch=False)
    b = VideoEpochSampler(video, clips_per_video=2, num_replicas=1, rank=0, seed=4, with_epoch=False,
                          order="blocks", storage_order=np.arange(36), block=4, window=2)
    assert sorted(a) == sorted(b)
    assert Counter(int(i) // 3 for i in b) == {v: 2 for v in range(12)}


@pytest.mark.parametrize("kw, message", [
    ({"order": "sorted"}, "order must be one of random, blocks, shards"),
    ({"order": "blocks"}, "needs storage_order"),
    ({"order": "blocks", "storage_order": [0, 1, 2], "shuffle": False}, "is a shuffle"),
    ({"order": "blocks", "storage_order": [0, 1, 1]}, "every clip index 0..2 once"),
    ({"order": "blocks", "storage_order": [0, 1, 2], "block": 0}, "block must be an int >= 1"),
    ({"order": "random", "storage_order": [0, 1, 2]}, "used by order='blocks' only"),
])
def test_block_order_settings_are_checked(kw, message):
    with pytest.raises(ValueError, match=message):
        DistributedClipSampler(3, num_replicas=1, rank=0, **kw)
