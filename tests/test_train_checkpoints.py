"""Checkpoints of long runs: rotation, the best one, resume from the newest complete one, SIGTERM and SIGHUP, early
stop."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time

from train import checkpoint as ckpt_io
from train.engine import StopRequest
from train.main import main, run_argv, stop_signals
from train.metrics import MetricsLog, read_metrics
from train.models import MODELS
from train.workers import STOP_SIGNALS

from .train_fixtures import (  # noqa: F401
    ROOT,
    assert_states_equal,
    common,
    final_state,
    slow_c3d,
    subprocess_env,
    tiny_data,
)

# 40 clips, batch 8: 5 steps per epoch.
ARGS = ["--batch-size", "8", "--optimizer", "adamw", "--lr", "1e-3", "--ckpt-every", "1"]


def _names(out) -> list[str]:
    return sorted(f for f in os.listdir(out) if f.endswith(".pt"))


def test_rotation_keeps_the_last_k_and_the_best(tiny_data, tmp_path):
    """lr 0: the first evaluation is the best and nothing improves on it."""
    out = tmp_path / "rot"
    s = run_argv(common(tiny_data, out) + ARGS + ["--lr", "0", "--epochs", "2", "--keep-last", "2",
                                                 "--val-data", tiny_data])
    assert s["step"] == 10
    assert _names(out) == ["checkpoint.pt", "checkpoint_best.pt", "checkpoint_step000000009.pt",
                           "checkpoint_step000000010.pt"]
    assert os.path.samefile(out / "checkpoint.pt", out / "checkpoint_step000000010.pt")  # a link, not a copy
    best = ckpt_io.load(str(out / "checkpoint_best.pt"))
    assert best["step"] == 5 and best["best"] == {"best": s["eval"]["video_top1"], "best_step": 5, "since": 0}
    assert final_state(out)["best"]["since"] == 1


def test_resume_falls_back_when_the_newest_is_damaged(tiny_data, tmp_path, capsys):
    out = tmp_path / "dmg"
    run_argv(common(tiny_data, out) + ARGS + ["--epochs", "2", "--max-steps", "4"])
    newest = out / "checkpoint_step000000004.pt"
    with open(newest, "r+b") as fh:  # truncated, as a copy interrupted by a full disk would leave it
        fh.truncate(os.path.getsize(newest) // 2)
    capsys.readouterr()
    run_argv(common(tiny_data, out) + ARGS + ["--epochs", "2", "--max-steps", "5", "--resume"])
    text = capsys.readouterr().out
    notes = [line for line in text.splitlines() if line.startswith("note: checkpoint")]
    assert len(notes) == 1 and "checkpoint_step000000004.pt cannot be read" in notes[0]
    assert "trying the previous one" in notes[0]
    assert "resumed from" in text and "checkpoint_step000000003.pt at step 3" in text
    assert final_state(out)["step"] == 5


def test_sigterm_saves_at_the_next_step_and_resumes_exactly(tiny_data, tmp_path):
    """SIGTERM to the trainer's process group: a checkpoint at a step boundary, exit 0, an exact resume."""
    args = ARGS + ["--epochs", "2", "--ckpt-every", "0"]
    run_argv(common(tiny_data, tmp_path / "a") + args)
    out = tmp_path / "b"
    metrics = out / "metrics.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "train", *common(tiny_data, out), *args, "--workers", "1"],
                            cwd=ROOT, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if metrics.exists() and metrics.read_text().count('"kind": "train"') >= 2:  # logged after step 2
            os.killpg(proc.pid, signal.SIGTERM)  # what a cluster does on preemption: the loader worker too
            break
        time.sleep(0.02)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr[-3000:]
    saved = final_state(out)
    assert 2 <= saved["step"] < 10, saved["step"]
    assert f"stopped by SIGTERM at step {saved['step']}: checkpoint saved" in stdout
    run_argv(common(tiny_data, out) + args + ["--resume"])
    assert_states_equal(final_state(tmp_path / "a")["model"], final_state(out)["model"])


def test_early_stop_after_patience_evaluations_without_improvement(tiny_data, tmp_path):
    s = run_argv(common(tiny_data, tmp_path / "es") + ARGS + ["--lr", "0", "--epochs", "10", "--ckpt-every", "0",
                                                             "--val-data", tiny_data, "--early-stop", "2"])
    # Evaluations after epochs 1, 2, 3: the first is the best, two more without improvement stop the run.
    assert s["epoch"] == 3 and s["step"] == 15
    assert s["stopped"] == ("early stop: validation video top-1 has not improved on "
                            f"{s['best']['best']:.4f} (step 5) in 2 evaluations")
    evals = [r for r in read_metrics(str(tmp_path / "es" / "metrics.jsonl")) if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [5, 10, 15]
    assert ckpt_io.load(str(tmp_path / "es" / "checkpoint_best.pt"))["step"] == 5


def test_the_final_evaluation_updates_the_best_checkpoint(tiny_data, tmp_path, monkeypatch):
    """Evaluations after step 5 (the epoch's end) and at step 7 (--max-steps, the final one) scoring better each
    time: checkpoint_best.pt is step 7's, and the checkpoint there knows it (a resumed run compares with it)."""
    import train.main

    real = train.main.evaluate
    scores = iter([0.5, 0.75])

    def improving(*args, **kwargs):
        return {**real(*args, **kwargs), "video_top1": next(scores)}

    monkeypatch.setattr(train.main, "evaluate", improving)
    out = tmp_path / "best"
    s = run_argv(common(tiny_data, out) + ARGS + ["--epochs", "2", "--max-steps", "7", "--ckpt-every", "0",
                                                 "--val-data", tiny_data])
    assert s["step"] == 7 and s["eval"]["video_top1"] == 0.75
    best = ckpt_io.load(str(out / "checkpoint_best.pt"))
    assert best["step"] == 7 and best["best"] == {"best": 0.75, "best_step": 7, "since": 0}
    assert os.path.samefile(out / "checkpoint_best.pt", out / "checkpoint.pt")
    assert s["best"]["best_step"] == 7


SLOW_S = 0.75  # seconds each slow layer sleeps, forward and backward: a step of four takes 6 s


def test_sigterm_ends_a_slow_step_within_a_layer_and_resumes_exactly(tiny_data, tmp_path, monkeypatch):
    """A SIGTERM in the middle of step 2's backward pass (after its forward updated BatchNorm's statistics and
    drew dropout masks) ends the run within a slow layer, not after the step; the checkpoint is step 1's, with the
    RNG and buffers of step 2's start, and the resumed run ends on the weights of an unbroken one."""
    args = ARGS + ["--bn", "--epochs", "1", "--ckpt-every", "0"]
    run_argv(common(tiny_data, tmp_path / "a") + args)
    calls: list[float] = []
    signalled: list[float] = []
    saved: list[float] = []

    def sigterm_in_step_2_backward() -> None:
        while len(calls) < 2:
            time.sleep(0.01)
        time.sleep(4 * SLOW_S + SLOW_S / 2)  # step 2's forward passes four slow layers, then its backward
        signalled.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGTERM)

    real_save = ckpt_io.save_checkpoint

    def timed_save(*a, **kw):
        saved.append(time.monotonic())
        return real_save(*a, **kw)

    out = tmp_path / "b"
    with monkeypatch.context() as patch:
        patch.setitem(MODELS, "c3d", dataclasses.replace(MODELS["c3d"], builder=slow_c3d(calls, SLOW_S)))
        patch.setattr(ckpt_io, "save_checkpoint", timed_save)
        timer = threading.Thread(target=sigterm_in_step_2_backward, daemon=True)
        timer.start()
        s = run_argv(common(tiny_data, out) + args)
        timer.join(5)
    assert s["stopped"] == "signal SIGTERM" and s["step"] == 1, s["stopped"]
    assert len(saved) == 1 and saved[0] - signalled[0] < 2 * SLOW_S, saved[0] - signalled[0]  # a step: 8 x SLOW_S
    assert final_state(out)["step"] == 1
    run_argv(common(tiny_data, out) + args + ["--resume"])
    assert_states_equal(final_state(tmp_path / "a")["model"], final_state(out)["model"])


def test_sighup_saves_and_says_how_to_resume(tiny_data, tmp_path, monkeypatch, capsys):
    """A closed terminal or a dropped SSH session (SIGHUP) is a stop like SIGTERM (issue 40: the run died, with
    nothing saved since the last epoch under the default --ckpt-every 0, and nothing said)."""
    args = ARGS + ["--epochs", "1", "--ckpt-every", "0"]
    out = tmp_path / "hup"
    real_log = MetricsLog.log

    def hang_up_after_step_2(self, record):
        real_log(self, record)
        if record.get("kind") == "train" and record.get("step") == 2:
            os.kill(os.getpid(), signal.SIGHUP)

    untaken: list[int] = []
    before = signal.signal(signal.SIGHUP, lambda signum, frame: untaken.append(signum))  # not this test run's end
    try:
        with monkeypatch.context() as patch:
            patch.setattr(MetricsLog, "log", hang_up_after_step_2)
            assert main(common(tiny_data, out) + args) == 0
    finally:
        signal.signal(signal.SIGHUP, before)
    assert untaken == []
    text = capsys.readouterr().out
    saved = final_state(out)["step"]
    assert saved == 2 or saved == 3, saved  # the step in progress is abandoned, or ends first under threads
    assert f"stopped by SIGHUP at step {saved}: checkpoint saved; run the same command with --resume" in text
    assert ckpt_io.resume_problem(final_state(out)) is None  # a whole checkpoint: the SIGTERM tests resume one


def test_a_run_started_under_nohup_keeps_ignoring_sighup():
    """``nohup`` asks for a run that goes on when its terminal closes: the trainer leaves a stop signal it was
    started ignoring alone, and takes the others."""
    before = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        stop = StopRequest()
        with stop_signals(stop):
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            assert all(signal.getsignal(sig) == stop.handler for sig in STOP_SIGNALS if sig != signal.SIGHUP)
        assert {sig: signal.getsignal(sig) for sig in STOP_SIGNALS} == {**before, signal.SIGHUP: signal.SIG_IGN}
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
