"""Errors a new user meets (issue 8): one line, exit 2, naming what to do; and the final summary."""

from __future__ import annotations

import json
import os

import pytest

from train.args import build_parser
from train.main import main, run_argv

from .train_fixtures import common, final_state, one_line_error, tiny_data  # noqa: F401

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


def test_plain_run_prints_a_summary_and_help_shows_defaults(tiny_data, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(common(tiny_data, out) + ONE_STEP + ["--val-data", tiny_data]) == 0
    text = capsys.readouterr().out
    summary = json.load(open(out / "summary.json"))
    assert "trained 1 steps (0 epochs)" in text
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
    assert "already reached --max-steps 1 (step 1, epoch 0): nothing left to train; raise --max-steps to go on" in out
    assert final_state(tmp_path / "run")["step"] == 1


def test_validation_classes_that_differ_point_to_convert_classes(tiny_data, tmp_path, capsys):
    from convert.job import JobOptions, run_job
    from convert.plan import ConvertConfig

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
