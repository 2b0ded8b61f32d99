"""A shard process is sent its own shard's part of the plan and never reads plan.json; the job reads plan.json with
the manifest's guards, and refuses a damaged one in one line naming the file and the fix."""

from __future__ import annotations

import io
import json
import os
import threading
import time

import pytest

from convert.job import supervise
from convert.job.childproc import LineProcess
from convert.job.supervise import ShardFailed, ShardOptions, _Child
from convert.worker.plan import ConvertConfig, Plan, PlanError, ShardPlan, load_plan, make_plan
from convert.worker.shard_worker import HOOK_ENV, plan_command, read_shard_plan
from convert.worker.sources import Source, VideoItem, load_source

from .convert_helpers import run_cli

CONFIG = ConvertConfig(size=(32, 40), clip_len=4, max_clips=1)


def _plan(shards: int, per_shard: int, path_len: int = 20) -> Plan:
    """A plan of ``shards * per_shard`` videos whose files need not exist (paths padded to ``path_len``)."""
    items = [VideoItem(f"v{i:07d}", f"/nowhere/{'p' * path_len}/v{i:07d}.mp4", i % 3)
             for i in range(shards * per_shard)]
    return make_plan(Source(items, ["a", "b", "c"]), CONFIG, shards, {"path": "/nowhere"})


def _hang() -> None:
    """A shard hook (run in the shard process as it starts) that never returns: a process stuck before its plan."""
    time.sleep(3600)


def test_a_shard_process_converts_from_its_own_part_and_never_reads_plan_json(tiny_synthetic_tree, tmp_path):
    source = load_source(tiny_synthetic_tree)
    plan = make_plan(source, CONFIG, 2, {"path": tiny_synthetic_tree})
    out = tmp_path / "out"
    out.mkdir()
    (out / "plan.json").write_text('{"format": "videoclips", "shards": [')  # read, it would end the process
    shard = plan.shard(1)
    child = _Child(str(out), shard, ShardOptions())
    try:
        hello = child.read(timeout=60)
        assert hello is not None and hello["ready"] is True and hello["done"] == []
        child.send({"op": "video", "index": 0})
        record = child.read(timeout=60)
        assert record is not None and (record["video_id"], record["status"]) == (shard.items[0].id, "ok")
        child.send({"op": "finish"})
        summary = child.read(timeout=60)
        assert summary is not None and summary["finished"] is True
        assert child.reap() == 0
    finally:
        child.kill()
        child.close()
    meta = json.loads((out / "shards" / "shard-00001" / "index.json").read_text())["meta"]
    assert (meta["index"], meta["count"], meta["classes"]) == (1, 2, plan.classes)


def test_the_first_line_holds_the_shards_own_videos_whatever_the_plans_size():
    small, large = _plan(3, 5), _plan(300, 5)
    for plan in (small, large):
        line = json.dumps(plan_command(plan.shard(1))) + "\n"
        assert read_shard_plan(io.StringIO(line), 1) == plan.shard(1)
        sent = {it[0] for it in json.loads(line)["shard"]["items"]}
        assert sent == {it.id for it in plan.shards[1]}  # no other shard's video
    # Shards of the same size: the same line, from a plan of 15 videos or of 1,500, but for the count of shards.
    lines = [json.dumps(plan_command(plan.shard(1))) for plan in (small, large)]
    assert len(lines[1]) - len(lines[0]) == len("300") - len("3")
    assert large.shard(299).count == 300 and large.shard(299).classes == ("a", "b", "c")


@pytest.mark.parametrize("line, message", ids=["ended", "not JSON", "a command", "not a plan", "another shard's"],
                         argvalues=[
    ("", "shard-00001: its input ended before the shard's plan, which the job sends first"),
    ("nonsense\n", "shard-00001: the first line of its input is not JSON"),
    ('{"op": "video", "index": 0}\n', "shard-00001: the first line of its input is not the shard's plan"),
    ('{"op": "plan", "shard": {"index": 1}}\n', "shard-00001: not a shard's plan: KeyError: 'config'"),
    ("PLAN_OF_2", "shard-00001: was sent the plan of shard-00002"),
])
def test_a_shard_process_without_its_plan_first_stops_in_one_line(line, message):
    if line == "PLAN_OF_2":
        line = json.dumps(plan_command(_plan(3, 2).shard(2))) + "\n"
    with pytest.raises(PlanError) as exc:
        read_shard_plan(io.StringIO(line), 1)
    assert str(exc.value).startswith(message) and "\n" not in str(exc.value)


def test_a_shard_plan_is_checked():
    with pytest.raises(ValueError, match="shard index 3 is not one of the plan's 3 shards"):
        ShardPlan(config=CONFIG, classes=("a",), index=3, count=3, items=())
    with pytest.raises(TypeError, match="VideoItems"):
        ShardPlan(config=CONFIG, classes=("a",), index=0, count=1, items=(("v", "/v.mp4", 0),))  # type: ignore[arg-type]


def test_a_line_longer_than_the_pipe_waits_for_its_reader_and_no_longer_than_the_timeout():
    """The plan goes down a pipe that holds less than a large shard's line: its writer waits for the reader, and
    gives up (TimeoutError) on one that never reads, instead of hanging the job."""
    line = {"op": "plan", "pad": "x" * (1 << 20)}
    for reads in (True, False):
        r, w = os.pipe()
        proc = LineProcess.__new__(LineProcess)  # its pipe alone: no process behind it
        proc.stdin = os.fdopen(w, "wb")
        got = bytearray()

        def drain() -> None:
            while chunk := os.read(r, 1 << 16):
                got.extend(chunk)

        reader = threading.Thread(target=drain)
        try:
            if reads:
                reader.start()
                proc.send(line, timeout=30)
                assert os.get_blocking(w)  # as it was: later commands are written the ordinary way
            else:
                t0 = time.monotonic()
                with pytest.raises(TimeoutError):
                    proc.send(line, timeout=0.3)
                assert time.monotonic() - t0 < 10
        finally:
            proc.stdin.close()
            if reads:
                reader.join()
            os.close(r)
        if reads:
            assert json.loads(got) == line


@pytest.mark.parametrize("per_shard", [2, 2000])  # a line that fits the pipe (the answer waited for) and one that
def test_a_shard_process_that_hangs_as_it_starts_fails_its_shard_in_one_line(tmp_path, monkeypatch, per_shard):
    """... does not (the plan's write waited for): either way the shard fails after the start's timeout."""
    monkeypatch.setattr(supervise, "START_TIMEOUT_S", 0.5)
    monkeypatch.setenv(HOOK_ENV, f"{__name__}:_hang")
    shard = _plan(1, per_shard, path_len=100).shard(0)
    with pytest.raises(ShardFailed) as exc:
        supervise.run_shard(str(tmp_path), shard, ShardOptions())
    assert str(exc.value) == (f"shard-00000: shard process gave no sign of starting within 0.5s (it hangs?); see "
                              f"{tmp_path}/logs/shard-00000.log")


def _valid_plan_text() -> str:
    return json.dumps(_plan(2, 3).to_dict(), indent=1)


@pytest.mark.parametrize("content, reason", ids=["nested", "truncated", "a list", "another format", "wrong fields",
                                                 "a FIFO"], argvalues=[
    ("[" * 100_000 + "]" * 100_000, "the plan is not valid JSON: RecursionError"),
    (_valid_plan_text().split("/nowhere")[0] + "/nowh", "the plan is not valid JSON: JSONDecodeError: Unterminated "
                                                         "string"),
    ("[1, 2]", "not a videoclips plan (format 'list')"),
    ('{"format": "other"}', "not a videoclips plan (format 'other')"),
    ('{"format": "videoclips", "config": 3}', "not a readable plan (TypeError"),
    ("FIFO", "the plan is not a regular file"),
])
def test_a_damaged_plan_is_refused_in_one_line_naming_it_and_the_fix(tmp_path, content, reason):
    out = tmp_path / "out"
    out.mkdir()
    path = out / "plan.json"
    if content == "FIFO":
        os.mkfifo(path)  # opened without blocking, refused unread
    else:
        path.write_text(content)
    with pytest.raises(PlanError) as exc:
        load_plan(str(out))
    message = str(exc.value)
    assert message.startswith(f"{path}: {reason}") and "\n" not in message
    assert message.endswith(f"it is the job's only record of which video goes to which shard: put back a copy of "
                            f"it, or convert into another OUT (or remove {out} and run again)")


def test_a_plan_larger_than_a_plan_may_be_is_refused_unread(tmp_path, monkeypatch):
    import convert.worker.plan as plan_module

    (tmp_path / "plan.json").write_text(_valid_plan_text())
    assert load_plan(str(tmp_path)) == _plan(2, 3)
    monkeypatch.setattr(plan_module, "MAX_PLAN_BYTES", 100)
    with pytest.raises(PlanError, match=r"plan.json: the plan is more than the 100 bytes a plan may have; it is"):
        load_plan(str(tmp_path))


def test_a_rerun_on_a_deeply_nested_plan_says_so_in_one_line(tiny_synthetic_tree, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "plan.json").write_text("[" * 100_000 + "]" * 100_000)
    r = run_cli(tiny_synthetic_tree, str(out), "--no-progress")
    assert r.returncode == 2
    assert r.stderr.startswith(f"convert: error: {out}/plan.json: the plan is not valid JSON: RecursionError")
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr and "put back a copy of it" in r.stderr
