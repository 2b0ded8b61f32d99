"""The order in which the job hands shards to its joblib workers: heaviest first."""

from __future__ import annotations


def test_shards_run_largest_first_when_workers_take_several(tmp_path, monkeypatch):
    """Weighed by their videos' file sizes (hand-made files of known sizes), heaviest shard first."""
    import convert.job.schedule as schedule
    from convert.job.run import JobOptions
    from convert.worker.plan import ConvertConfig, Plan
    from convert.worker.sources import VideoItem

    def video(name: str, size: int) -> VideoItem:
        path = tmp_path / name
        path.write_bytes(b"x" * size)
        return VideoItem(name, str(path), 0)

    shards = [[video("a", 10), video("b", 10)],            # 20 bytes
              [video("c", 300)],                           # 300
              [video("d", 50), video("e", 70)],            # 120
              [video("gone", 0), VideoItem("missing", str(tmp_path / "missing"), 0)]]  # 0: a missing file weighs 0
    assert [schedule._source_bytes(s) for s in shards] == [20, 300, 120, 0]
    plan = Plan(ConvertConfig(), ["c"], shards)
    order = []

    def run_shard(out, shard, *a):
        assert shard.items == tuple(plan.shards[shard.index])  # each shard's own videos, nothing more
        order.append(shard.index)
        return {"index": shard.index}

    monkeypatch.setattr(schedule, "run_shard", run_shard)
    schedule.run_shards(str(tmp_path), plan, JobOptions(workers=1, progress=False))
    assert order == [1, 2, 0, 3]
    order.clear()
    schedule.run_shards(str(tmp_path), plan, JobOptions(workers=4, progress=False))
    assert sorted(order) == [0, 1, 2, 3]  # as many workers as shards: no order to choose
