"""The sampler's traversal orders as objects (``loaders.sampler.ClipOrder``), each with its own tests, and the
shard schedule a shard cache prefetches by."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from loaders import DistributedClipSampler
from loaders.sampler import (
    ORDERS,
    BlockOrder,
    ClipOrder,
    RandomOrder,
    ShardSpan,
    ShardWindowOrder,
    VideoEpochSampler,
    clip_shards,
    draws,
    make_order,
)


def _shards(sizes: list[int]) -> np.ndarray:
    """Clip -> shard for shards of these sizes, clips numbered shard after shard (as a conversion numbers them)."""
    return np.repeat(np.arange(len(sizes)), sizes)


def _windowed(n_or_shards: np.ndarray, *, window: int, world: int = 1, rank: int = 0, seed: int = 3,
              **kw) -> DistributedClipSampler:
    return DistributedClipSampler(int(n_or_shards.size), num_replicas=world, rank=rank, seed=seed, with_epoch=False,
                                  order="shards", clip_shards=n_or_shards, shard_window=window, **kw)


# -- the objects and their names ----------------------------------------------------

def test_orders_are_objects_chosen_by_name_or_passed_as_they_are():
    assert ORDERS == ("random", "blocks", "shards")
    assert isinstance(make_order("random"), RandomOrder)
    assert isinstance(make_order("blocks", storage_order=np.arange(8), block=2, window=2), BlockOrder)
    assert isinstance(make_order("shards", clip_shards=_shards([4, 4]), shard_window=1), ShardWindowOrder)
    given = ShardWindowOrder(clip_shards=_shards([3, 5]), window=1)
    s = DistributedClipSampler(8, num_replicas=1, rank=0, order=given)
    assert s.traversal is given and s.order == "shards" and "shards, 1 at a time" in repr(s)
    for order in (make_order("random"), given):
        assert isinstance(order, ClipOrder)


@pytest.mark.parametrize("kw, message", [
    ({"order": "shards"}, "needs clip_shards"),
    ({"order": "shards", "clip_shards": [0, 0]}, "shard of each of the 3 clips"),
    ({"order": "shards", "clip_shards": [0, -1, 1]}, "shard numbers >= 0"),
    ({"order": "shards", "clip_shards": [0, 1, 1], "shard_window": 0}, "shard_window must be an int >= 1"),
    ({"order": "shards", "clip_shards": [0, 1, 1], "shuffle": False}, "is a shuffle"),
    ({"order": "random", "clip_shards": [0, 1, 1]}, "used by order='shards' only"),
    ({"order": ShardWindowOrder(clip_shards=[0, 1, 1]), "clip_shards": [0, 1, 1]}, "go into the order object"),
])
def test_shard_order_settings_are_checked(kw, message):
    with pytest.raises(ValueError, match=message):
        DistributedClipSampler(3, num_replicas=1, rank=0, **kw)


def test_random_order_is_a_permutation_drawn_from_the_epochs_generator():
    candidates = np.arange(10, 30)
    got = RandomOrder().arrange(candidates, draws(2, 5, 1))
    assert sorted(got.tolist()) == candidates.tolist()
    assert got.tolist() == candidates[draws(2, 5, 1).permutation(20)].tolist()


def test_block_order_object_is_the_samplers_block_order():
    storage = np.random.default_rng(0).permutation(24)
    order = BlockOrder(storage_order=storage, block=3, window=2)
    order.check(24)
    named = DistributedClipSampler(24, num_replicas=1, rank=0, seed=4, with_epoch=False, order="blocks",
                                   storage_order=storage, block=3, window=2)
    assert order.arrange(np.arange(24), draws(2, 4, 0)).tolist() == named.indices(0).tolist()


# -- the shard-windowed order ---------------------------------------------------------

def test_each_window_of_the_epoch_reads_at_most_window_shards_and_every_clip_once():
    sizes = [5, 7, 3, 6, 4, 8, 2, 5, 6]  # shards of unequal sizes, as a conversion's are
    shard_of = _shards(sizes)
    n, window = shard_of.size, 2
    s = _windowed(shard_of, window=window)
    orders = []
    for epoch in range(3):
        got = s.indices(epoch)
        assert sorted(got.tolist()) == list(range(n))  # every clip once
        shards = shard_of[got]
        # Cut the epoch where a new shard appears beyond the window: each window is `window` whole shards.
        seen = list(dict.fromkeys(shards.tolist()))  # shards in the order the epoch first reads them
        windows = [seen[i:i + window] for i in range(0, len(seen), window)]
        start = 0
        for members in windows:
            count = sum(sizes[m] for m in members)
            assert set(shards[start:start + count].tolist()) == set(members)  # <= window shards, read whole
            start += count
        assert start == n
        orders.append(got.tolist())
    assert len({tuple(o) for o in orders}) == 3  # windows and clips drawn anew each epoch
    again = _windowed(shard_of, window=window)
    assert again.indices(2).tolist() == orders[2]  # a function of (seed, epoch) alone
    assert _windowed(shard_of, window=window, seed=4).indices(2).tolist() != orders[2]


def test_windows_are_dealt_round_robin_so_every_rank_reads_the_same_window_at_once():
    shard_of = _shards([6] * 8)
    ranks = [_windowed(shard_of, window=2, world=3, rank=r) for r in range(3)]
    shares = [r.indices(1) for r in ranks]
    assert sorted(np.concatenate(shares).tolist()) == list(range(48))  # disjoint, every clip once
    glob = ranks[0].global_order(1)
    window_of = {}  # shard -> its window in this epoch (12 clips, two shards, per window)
    for k in range(0, 48, 12):
        for shard in set(shard_of[glob[k:k + 12]].tolist()):
            window_of[shard] = k // 12
    assert len(window_of) == 8
    for r, share in enumerate(shares):
        assert share.tolist() == glob[r::3].tolist()
    for k in range(16):  # at every step the ranks read from one window, or two neighbours at its edge
        now = {window_of[int(shard_of[share[k]])] for share in shares}
        assert max(now) - min(now) <= 1


def test_resume_mid_window_is_exact_on_the_same_and_on_another_rank_count():
    shard_of = _shards([5, 7, 3, 6, 4, 8])
    n = shard_of.size
    two = [_windowed(shard_of, window=2, world=2, rank=r, drop_last=True) for r in range(2)]
    for s in two:
        s.set_epoch(2)
    whole = [list(s) for s in two]
    state = two[1].state_dict(consumed=5)  # 10 clips read: inside the first window
    assert state["global_position"] == 10
    resumed = _windowed(shard_of, window=2, world=2, rank=1, drop_last=True)
    resumed.load_state_dict(state)
    resumed.set_epoch(2)
    assert list(resumed) == whole[1][5:]
    one = _windowed(shard_of, window=2, drop_last=True)
    one.load_state_dict(state)  # the same epoch on one rank: the rest of the global order
    one.set_epoch(2)
    read = [i for share in whole for i in share[:5]] + list(one)
    assert Counter(read) == Counter(range(n))


def test_video_epochs_take_the_shard_order_too():
    video = np.repeat(np.arange(12), 2)
    shard_of = np.repeat(np.arange(4), 6)  # three videos per shard
    s = VideoEpochSampler(video, clips_per_video=1, num_replicas=1, rank=0, seed=1, with_epoch=False,
                          order="shards", clip_shards=shard_of, shard_window=1)
    got = s.indices(0)
    assert Counter(int(i) // 2 for i in got) == {v: 1 for v in range(12)}
    shards = shard_of[got].tolist()
    assert all(len(set(shards[k:k + 3])) == 1 for k in range(0, 12, 3))  # one shard at a time, read whole


# -- the schedule a cache prefetches by ---------------------------------------------

def test_shard_schedule_lists_the_shards_in_the_order_the_epoch_needs_them():
    sizes = [5, 7, 3, 6, 4, 8]
    shard_of = _shards(sizes)
    s = _windowed(shard_of, window=2, world=2, drop_last=True)
    glob = s.global_order(1)
    spans = s.shard_schedule(1)
    assert [sp.shard for sp in spans] == list(dict.fromkeys(shard_of[glob].tolist()))
    for sp in spans:
        where = np.flatnonzero(shard_of[glob] == sp.shard)
        assert (sp.first, sp.last, sp.clips) == (where[0], where[-1], where.size)
    # Windows of two: a shard's last clip comes before the third shard after it is first needed.
    for k, sp in enumerate(spans):
        if k + 2 < len(spans) and k % 2 == 0:
            assert max(sp.last, spans[k + 1].last) < spans[k + 2].first
    # After a resume, from the global position on.
    later = s.shard_schedule(1, start=20)
    assert [sp.shard for sp in later] == list(dict.fromkeys(shard_of[glob[20:]].tolist()))
    assert all(sp.first >= 20 for sp in later)
    assert s.shard_schedule(1, start=s.total_size) == []


def test_shard_schedule_of_other_orders_takes_the_clip_to_shard_map(tiny_store):
    s = DistributedClipSampler(len(tiny_store), num_replicas=2, rank=0, seed=0)
    shard_of = clip_shards(tiny_store)
    assert shard_of.size == len(tiny_store) and shard_of.tolist() == sorted(shard_of.tolist())
    for i in (0, len(tiny_store) - 1):
        v, _ = tiny_store.locate(i)
        assert shard_of[i] == tiny_store.video_shard[v]
    spans = s.shard_schedule(0, shard_of)
    assert sorted(sp.shard for sp in spans) == sorted(set(shard_of.tolist()))
    assert sum(sp.clips for sp in spans) == s.total_size
    with pytest.raises(ValueError, match="needs clip_to_shard"):
        s.shard_schedule(0)
    with pytest.raises(ValueError, match="start must be a global position"):
        s.shard_schedule(0, shard_of, start=-1)
    assert ShardSpan(shard=1, first=0, last=2, clips=3) == ShardSpan(shard=1, first=0, last=2, clips=3)


@pytest.fixture(scope="module")
def tiny_store(tiny_data):
    from loaders import open_clips

    return open_clips(tiny_data)


from .train_fixtures import tiny_data  # noqa: E402,F401
