"""Errors a new user meets (issue 8): one line, exit 2, naming what to do; and the final summary."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from train import checkpoint as ckpt_io
from train import runfiles
from train.args import build_parser
from train.main import main, run_argv

from .train_fixtures import (  # noqa: F401
    ROOT,
    common,
    final_state,
    one_line_error,
    subprocess_env,
    tiny_data,
)

ONE_STEP = ["--epochs", "1", "--max-steps", "1", "--batch-size", "8"]


def test_resume_with_other_model_settings_names_them(tiny_data, tmp_path, capsys):
    run_argv(common(tiny_data, tmp_path / "run") + ONE_STEP)
    code = main(common(tiny_data, tmp_path / "run") + ["--epochs", "1", "--max-steps", "2", "--batch-size", "8",
                                                      "--resume", "--model-width", "0.125", "--optimizer", "adamw"])
    assert code == 2
    err = one_line_error(capsys)
    assert "was saved with --model-width 0.0625 (this run: 0.125), --optimizer sgd (this run: adamw)" in err
    assert final_state(tmp_path / "run")["step"] == 1  # left alone


def test_out_holding_a_run_needs_resume_or_overwrite(tiny_data, tmp_path, capsys):
    run_argv(common(tiny_data, tmp_path / "run") + ONE_STEP)
    before = open(tmp_path / "run" / "metrics.jsonl").read()
    assert main(common(tiny_data, tmp_path / "run") + ONE_STEP) == 2
    err = one_line_error(capsys)
    assert "holds a run (checkpoints): pass --resume to continue it, --overwrite to start it again" in err
    assert open(tmp_path / "run" / "metrics.jsonl").read() == before  # nothing truncated
    assert main(common(tiny_data, tmp_path / "run") + ONE_STEP + ["--overwrite"]) == 0
    assert final_state(tmp_path / "run")["step"] == 1


def test_overwrite_leaves_nothing_of_the_previous_run_and_nothing_else_is_removed(tiny_data, tmp_path,
                                                                                  monkeypatch):
    """Issue 40: ``--overwrite`` left the previous run's curves.png and summary.json beside the new metrics.jsonl.
    Every file a run writes goes (those of a longer run with evaluations, TensorBoard and a profile too); the
    user's files stay, and so does a folder that is a link (a TensorBoard folder shared by several runs)."""
    out = tmp_path / "run"
    run_argv(common(tiny_data, out) + ONE_STEP)
    assert {"curves.png", "summary.json", "metrics.jsonl", "checkpoint.pt"} <= set(os.listdir(out))
    older = ["checkpoint_step000000099.pt", "checkpoint_best.pt", ".checkpoint.pt.tmp.99", "metrics.jsonl.tmp",
             "eval/epoch000.json", "eval/final_confusion.png", "eval/val_center_step99.json",
             "profile/rank0.1700000000000000000.pt.trace.json"]
    users = ["notes.txt", "eval/mine.json", "checkpoint_step1.pt.bak", "shared/events.out.tfevents.1.host.1.0"]
    for name in older + users:
        (out / name).parent.mkdir(exist_ok=True)
        (out / name).write_bytes(b"x")
    os.symlink(out / "shared", out / "tb")
    real_save = ckpt_io.save_checkpoint
    at_first_save: list[list[str]] = []

    def listing_save(*a, **kw):
        at_first_save.append(runfiles.run_files(str(out)))
        return real_save(*a, **kw)

    monkeypatch.setattr(ckpt_io, "save_checkpoint", listing_save)
    assert main(common(tiny_data, out) + ONE_STEP + ["--overwrite"]) == 0
    assert set(at_first_save[0]) <= {"metrics.jsonl"}  # the new run's log, and nothing of the old run
    assert all((out / name).exists() for name in users)
    assert not os.path.exists(out / "profile") and os.path.islink(out / "tb")  # emptied and removed; left alone
    assert sorted(runfiles.run_files(str(out))) == ["checkpoint.pt", "checkpoint_step000000001.pt", "curves.png",
                                                    "metrics.jsonl", "summary.json"]


def test_plain_run_prints_a_summary_and_help_shows_defaults(tiny_data, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(common(tiny_data, out) + ONE_STEP + ["--val-data", tiny_data]) == 0
    text = capsys.readouterr().out
    summary = json.load(open(out / "summary.json"))
    assert "trained 1 step (0 epochs)" in text
    assert "validation: clip top-1" in text and "(20 videos, 40 clips; chance 20.0%)" in text
    for key, path in (("checkpoint:", summary["checkpoint"]), ("metrics:", summary["metrics"]),
                      ("curves:", summary["curves"])):
        assert f"{key}" in text and path in text and os.path.exists(path)
    assert "confusion matrix:" in text and "lr 0.0008 = --lr 0.003 x 8/30 (linear scaling" in text
    help_text = build_parser().format_help()
    assert "(default runs/c3d)" in " ".join(help_text.split())


def test_resume_of_a_finished_run_says_so(tiny_data, tmp_path, capsys):
    run_argv(common(tiny_data, tmp_path / "run") + ONE_STEP)
    capsys.readouterr()
    assert main(common(tiny_data, tmp_path / "run") + ONE_STEP + ["--resume"]) == 0
    out = capsys.readouterr().out
    assert ("already reached --max-steps 1 at step 1 (epoch 1, 1 step into it): nothing left to train; raise "
            "--max-steps to go on") in out
    # The summary says so too, instead of a speed of the no steps it trained.
    assert "nothing left to train: the run had already reached --max-steps 1 (step 1, 0 epochs); raise " \
           "--max-steps to go on" in out
    assert "trained" not in out and " in 0 s" not in out
    assert final_state(tmp_path / "run")["step"] == 1


def test_max_steps_at_an_epoch_end_counts_that_epoch_and_resumes_after_it(tiny_data, tmp_path, capsys):
    """40 clips at batch 8 are 5 steps per epoch: --max-steps 5 ends exactly at the end of epoch 1."""
    out = tmp_path / "run"
    args = common(tiny_data, out) + ["--epochs", "2", "--batch-size", "8"]
    assert main(args + ["--max-steps", "5"]) == 0
    text = capsys.readouterr().out
    assert "trained 5 steps (1 epoch) in" in text
    assert json.load(open(out / "summary.json"))["epoch"] == 1
    saved = final_state(out)
    assert (saved["step"], saved["epoch"], saved["epoch_step"]) == (5, 0, 5)  # the stored state as it was
    assert main(args + ["--max-steps", "5", "--resume"]) == 0
    text = capsys.readouterr().out
    assert "already reached --max-steps 5 at step 5 (the end of epoch 1): nothing left to train" in text
    assert "nothing left to train: the run had already reached --max-steps 5 (step 5, 1 epoch)" in text
    assert main(args + ["--max-steps", "10", "--resume"]) == 0
    text = capsys.readouterr().out
    assert "at step 5 (the end of epoch 1)" in text
    assert "trained 10 steps (5 in this run, from step 5; 2 epochs) in" in text
    assert json.load(open(out / "summary.json"))["epoch"] == 2


def test_the_resume_line_counts_epochs_as_the_progress_lines_do(tiny_data, tmp_path, capsys, monkeypatch):
    """Both count epochs from 1 (the checkpoint keeps counting from 0): step 6 of 5 per epoch is in epoch 2."""
    from train import heartbeat

    out = tmp_path / "run"
    args = [a for a in common(tiny_data, out) if a != "--no-progress"] + ["--epochs", "2", "--batch-size", "8"]
    assert main(args + ["--max-steps", "6", "--no-progress"]) == 0
    assert final_state(out)["epoch"] == 1  # stored from 0
    capsys.readouterr()
    monkeypatch.setattr(heartbeat, "HEARTBEAT_S", 0.01)  # progress lines every 0.01 s, not every minute
    assert main(args + ["--max-steps", "7", "--resume"]) == 0
    text = capsys.readouterr().out
    assert "at step 6 (epoch 2, 1 step into it)" in text
    progress = [line for line in text.splitlines() if line.startswith("progress: step ")]
    assert progress and all("(epoch 2 of 2)" in line for line in progress), text


def _stop_after_saving(patch, step: int) -> None:
    """SIGTERM this process right after the checkpoint of ``step`` is saved (what a cluster's preemption does)."""
    from train import checkpoint as ckpt_io

    real = ckpt_io.save_checkpoint

    def save_then_stop(obj, out, at, *a, **kw):
        path = real(obj, out, at, *a, **kw)
        if at == step:
            os.kill(os.getpid(), signal.SIGTERM)
        return path

    patch.setattr(ckpt_io, "save_checkpoint", save_then_stop)


def test_a_stopped_run_says_validation_was_not_run_rather_than_asking_for_val_data(tiny_data, tmp_path, capsys,
                                                                                   monkeypatch):
    args = ["--epochs", "2", "--batch-size", "8", "--ckpt-every", "1", "--val-data", tiny_data]
    with monkeypatch.context() as patch:
        _stop_after_saving(patch, 2)
        assert main(common(tiny_data, tmp_path / "a") + args) == 0
    text = capsys.readouterr().out
    assert "stopped by SIGTERM at step" in text
    assert "validation: not run: the run was stopped by SIGTERM before evaluating on --val-data" in text
    assert "pass --val-data" not in text
    # Stopped after an evaluation (epoch 1's, at step 5): that one is given, and said to be the last one.
    with monkeypatch.context() as patch:
        _stop_after_saving(patch, 7)
        assert main(common(tiny_data, tmp_path / "b") + args) == 0
    text = capsys.readouterr().out
    assert "stopped by SIGTERM at step" in text
    assert "validation (the last evaluation, at step 5): clip top-1" in text and "pass --val-data" not in text


def test_a_mistyped_command_names_the_command_it_is_close_to(capsys):
    from train.commands import dispatch

    assert dispatch(["evl", "--checkpoint", "x"]) == 2
    err = one_line_error(capsys)
    assert err.startswith("unknown command evl; did you mean eval?")
    assert dispatch(["dmeo"]) == 2
    assert "did you mean demo?" in one_line_error(capsys)
    # Through python -m train itself (no torch is imported to say it).
    proc = subprocess.run([sys.executable, "-m", "train", "evl", "--checkpoint", "x"], cwd=ROOT,
                          env=subprocess_env(), capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2 and proc.stderr.startswith("train: error: unknown command evl; did you mean eval?")
    assert proc.stderr.count("\n") == 1


@pytest.mark.parametrize("layout", ["classes", "flat"])
def test_data_a_folder_of_videos_suggests_converting_into_another_folder(tmp_path, capsys, layout):
    videos = tmp_path / "videos"
    for name in ("run/a.mp4", "jump/b.mp4") if layout == "classes" else ("a.mp4", "b.mkv"):
        (videos / name).parent.mkdir(parents=True, exist_ok=True)
        (videos / name).write_bytes(b"")
    assert main(common(str(videos), tmp_path / "run") + ONE_STEP) == 2
    err = one_line_error(capsys)
    out = f"{videos}_clips"
    assert "a folder of" in err and "not a conversion" in err and f"then --data {out}" in err
    if layout == "classes":
        assert f"python -m convert {videos} {out}," in err
    else:
        assert f"python -m convert LABELS {out} --videos {videos}," in err
    assert not os.path.exists(out) and not (tmp_path / "run").exists()


def test_validation_classes_that_differ_point_to_convert_classes(tiny_data, tmp_path, capsys):
    from convert.job.run import JobOptions, run_job
    from convert.worker.plan import ConvertConfig

    # The same videos converted with the classes in another order (what two splits converted without
    # --classes could give): a real conversion, not an edited manifest (which its shards would refuse).
    manifest = json.load(open(os.path.join(tiny_data, "manifest.json")))
    classes = tmp_path / "classes.txt"
    classes.write_text("\n".join(reversed(manifest["classes"])) + "\n")
    val = str(tmp_path / "val")
    run_job(manifest["source"]["path"], val, ConvertConfig(size=(40, 52), max_clips=1),
            JobOptions(workers=2, progress=False), classes_file=str(classes))
    assert main(common(tiny_data, tmp_path / "run") + ONE_STEP + ["--val-data", val]) == 2
    err = one_line_error(capsys)
    assert "label numbers would differ" in err and "python -m convert SRC OUT --classes FILE" in err


@pytest.mark.parametrize("flag, value", [("--label-smoothing", "1.0"), ("--max-lr", "-1")])
def test_bad_option_values_are_one_line(tiny_data, tmp_path, capsys, flag, value):
    assert main(common(tiny_data, tmp_path / "run") + ONE_STEP + [flag, value]) == 2
    assert flag in one_line_error(capsys)
