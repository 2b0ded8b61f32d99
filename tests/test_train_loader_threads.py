"""The trainer on reader threads (its default loader): same weights as on worker processes, the
loader's own numbers in metrics.jsonl, and ``--profile`` writing a trace."""

from __future__ import annotations

import glob
import json
import os

from train.main import run_argv

from .test_train_run import assert_states_equal, common, final_state, tiny_data  # noqa: F401


def test_threads_train_exactly_like_processes_and_log_loader_numbers(tiny_data, tmp_path):  # noqa: F811
    args = ["--epochs", "2", "--max-steps", "7", "--batch-size", "8", "--log-every", "2", "--val-data", tiny_data]
    threads = run_argv(common(tiny_data, tmp_path / "threads") + args + ["--workers", "2", "--profile", "3"])
    procs = run_argv(common(tiny_data, tmp_path / "procs") + args + ["--workers", "1", "--loader", "processes"])
    assert_states_equal(final_state(tmp_path / "threads")["model"], final_state(tmp_path / "procs")["model"])
    assert threads["eval"]["clip_top1"] == procs["eval"]["clip_top1"] and threads["eval"]["clips"] == 40
    assert final_state(tmp_path / "threads")["args"]["loader"] == "threads"  # the default

    rows = [json.loads(line) for line in open(tmp_path / "threads" / "metrics.jsonl")]
    train_rows = [r for r in rows if r["kind"] == "train"]
    assert [r["step"] for r in train_rows] == [2, 4, 5, 7]  # every 2 steps and at each epoch's end (5 steps)
    for r in train_rows:
        # prefetch is build_loader's default of 4 batches; clips/s is None in a window where nothing was read
        assert 0 <= r["loader_queue_depth"] <= 4
        assert r["loader_clips_per_s"] is None or r["loader_clips_per_s"] > 0
    assert train_rows[0]["loader_clips_per_s"] > 0  # the first window holds the first reads
    proc_rows = [json.loads(line) for line in open(tmp_path / "procs" / "metrics.jsonl")]
    first = [r for r in proc_rows if r["kind"] == "train"][0]
    assert first["loader_clips_per_s"] > 0 and "loader_queue_depth" not in first

    # --profile 3: steps 3..5 (after one skipped and one warm-up step), one trace file for rank 0
    traces = glob.glob(str(tmp_path / "threads" / "profile" / "rank0.*.pt.trace.json"))
    assert len(traces) == 1 and os.path.getsize(traces[0]) > 0
    with open(traces[0]) as f:
        trace = json.load(f)
    names = {e.get("name") for e in trace["traceEvents"]}
    assert {"ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4"} <= names and "ProfilerStep#5" not in names
    assert "loader_wait" in names
    assert not os.path.exists(tmp_path / "procs" / "profile")


def test_profile_with_too_few_steps_says_so(tiny_data, tmp_path, capsys):  # noqa: F811
    run_argv(common(tiny_data, tmp_path / "run") + ["--max-steps", "1", "--batch-size", "8", "--profile", "2"])
    assert "too few to record any" in capsys.readouterr().out
    assert glob.glob(str(tmp_path / "run" / "profile" / "*.json")) == []
