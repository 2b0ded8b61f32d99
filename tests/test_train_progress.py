"""Without a terminal the trainer (and so the demo, which trains through it) prints a progress line at a fixed
interval: a log never goes quiet long enough to read as a hang."""

from __future__ import annotations

import dataclasses
import io
import re

import train.heartbeat
from train.heartbeat import Heartbeat
from train.main import run_argv
from train.models import MODELS

from .train_fixtures import common, slow_c3d, tiny_data  # noqa: F401


def test_progress_lines_at_a_fixed_interval_when_stdout_is_not_a_terminal(tiny_data, tmp_path, monkeypatch,
                                                                          capsys):
    monkeypatch.setattr(train.heartbeat, "HEARTBEAT_S", 0.25)
    slow = dataclasses.replace(MODELS["c3d"], builder=slow_c3d([], 0.15))  # 1.2 s per step: several lines per step
    monkeypatch.setitem(MODELS, "c3d", slow)
    argv = [a for a in common(tiny_data, tmp_path / "run") if a != "--no-progress"]
    run_argv(argv + ["--batch-size", "8", "--epochs", "1", "--max-steps", "2"])
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("progress: ")]
    assert any(re.fullmatch(r"progress: step 0 of 2 \(epoch 1 of 1\); step 1 running for \d+ s", line)
               for line in lines), lines
    assert any(re.fullmatch(r"progress: step 1 of 2 \(epoch 1 of 1\), [\d.]+ s/step, about \d+ s left, loss "
                            r"[\d.]+(; step 2 running for \d+ s)?", line) for line in lines), lines
    # --no-progress: none.
    run_argv(common(tiny_data, tmp_path / "quiet") + ["--batch-size", "8", "--epochs", "1", "--max-steps", "1"])
    assert "progress: " not in capsys.readouterr().out


def test_the_progress_line_names_an_evaluation_and_long_durations():
    beat = Heartbeat(total=3000, steps_per_epoch=100, epochs=30, interval=60.0, out=io.StringIO())
    beat.at_step(1000, 10)
    beat._started = beat._stepped - 7200.0  # two hours for 1000 steps: 7.2 s a step
    beat.loss(0.5)
    beat.phase("evaluating")
    beat._since -= 65.0
    assert beat.line() == ("progress: step 1000 of 3000 (epoch 11 of 30), 7.2 s/step, about 4 h 00 min left, "
                           "loss 0.5; evaluating for 1 min 05 s")
