"""Each option declared once (convert.format.options on TrainConfig's fields): the parser and the checks come from the
declarations, numbers are checked as they are parsed, and a usage error is one line."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from typing import Any

import pytest

from convert.format.options import added_later, settings
from train import TrainError
from train.args import build_parser
from train.config import TrainConfig
from train.demo import main as demo_main
from train.evalcmd import main as eval_main
from train.main import main

from .train_fixtures import ROOT, one_line_error, subprocess_env

NUMBERS = [s for s in settings(TrainConfig).values() if s.kind in (int, float) and s.option.group is not None]


def test_every_field_is_declared_and_every_option_comes_from_a_declaration():
    declared = settings(TrainConfig)
    assert list(declared) == [f.name for f in dataclasses.fields(TrainConfig)]
    options = {s.flag for s in declared.values() if s.option.group is not None}
    parsed = {o for a in build_parser()._actions for o in a.option_strings if o not in ("-h", "--help")}
    assert parsed == options | {"--no-lr-scaling", "--no-grad-as-bucket-view"}  # the two extra switches
    derived = {s.name for s in declared.values() if s.option.group is None}
    assert derived == {"auto_batch", "world_size", "epoch_samples", "steps_per_epoch", "lr_plan", "pad_last_batch"}
    assert NUMBERS  # each with a lower bound, checked as it is parsed (below)


@pytest.mark.parametrize("setting", NUMBERS, ids=[s.flag for s in NUMBERS])
def test_every_numeric_option_is_checked_as_it_is_parsed(setting):
    o = setting.option
    assert (o.ge, o.gt) != (None, None)  # a lower bound on every number
    bad = ["nan", "inf", "1e999"] if setting.kind is float else ["12Q", "x"] if o.byte_count else ["1.5", "x"]
    low = o.ge if o.ge is not None else o.gt
    bad.append(str(low - 1 if setting.kind is int else low - 0.5) if o.ge is not None else str(low))
    for text in bad:
        with pytest.raises(TrainError) as err:
            build_parser().parse_args(["--data", "x", f"{setting.flag}={text}"])
        message = str(err.value)
        assert message.startswith(f"argument {setting.flag}: ") and "\n" not in message, message
        assert message.endswith("(see python -m train --help)")
    default = o.default
    if default is not None and not isinstance(default, str):
        assert getattr(build_parser().parse_args(["--data", "x", f"{setting.flag}={default}"]), setting.name) \
            == default


def test_byte_counts_are_written_alike_in_every_command():
    from convert.format.options import byte_count  # what python -m convert verify --cache-limit and --max-memory take

    for text, value in (("200G", 200 << 30), ("512M", 512 << 20), ("1.5GiB", 3 << 29), ("4096", 4096)):
        assert build_parser().parse_args(["--data", "x", "--cache-limit", text]).cache_limit == value
        assert byte_count(1)(text) == value
    with pytest.raises(TrainError, match=r"argument --cache-limit: expected a byte count like 512M or 200G, got "
                                         r"'2 gallons' \(see python -m train --help\)"):
        build_parser().parse_args(["--data", "x", "--cache-limit", "2 gallons"])


@pytest.mark.parametrize("argv, message", [
    (["--lr", "nan"], "argument --lr: must be a finite number in [0, inf), got nan"),
    (["--dropout", "inf"], "argument --dropout: must be a finite number in [0, 1), got inf"),
    (["--workers", "-1"], "argument --workers: must be an integer >= 0, got -1"),
    (["--batch-size", "0"], "argument --batch-size: must be an integer >= 1 or 'auto', got 0"),
    (["--seed", "-3"], "argument --seed: must be an integer >= 0, got -3"),
    (["--bacth-size", "8"], "unrecognized option --bacth-size; did you mean --batch-size?"),
    (["--crop_size=32"], "unrecognized option --crop_size; did you mean --crop-size?"),
    (["--epoch", "1"], "ambiguous option: --epoch could match --epoch-mode, --epochs"),
    (["--warmup-steps", "5", "--warmup-epochs", "1"],
     "argument --warmup-epochs: not allowed with argument --warmup-steps"),
])
def test_usage_errors_are_one_line_before_any_work(tmp_path, capsys, argv, message):
    out = tmp_path / "run"
    assert main(["--data", str(tmp_path / "nowhere"), "--out", str(out), *argv]) == 2
    assert one_line_error(capsys) == f"{message} (see python -m train --help)"
    assert not out.exists()


def test_the_command_line_exits_with_status_2_and_one_line():
    proc = subprocess.run([sys.executable, "-m", "train", "--data", "x", "--lerning-rate", "0.1", "--lr", "nan"],
                          cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == "train: error: argument --lr: must be a finite number in [0, inf), got nan (see python -m " \
                          "train --help)\n"
    proc = subprocess.run([sys.executable, "-m", "train", "--data", "x", "--lerning-rate", "0.1"], cwd=ROOT,
                          env=subprocess_env(), capture_output=True, text=True, timeout=120, check=False)
    expected = "train: error: unrecognized option --lerning-rate (see python -m train --help)\n"
    assert (proc.returncode, proc.stderr) == (2, expected)


def test_demo_with_a_mistyped_option_stops_before_converting(tmp_path, capsys):
    out = tmp_path / "demo"
    assert demo_main(["--out", str(out), "--epoch", "1"]) == 2
    err = capsys.readouterr().err
    assert err == ("train demo: error: ambiguous option: --epoch could match --epoch-mode, --epochs (see python -m "
                   "train --help)\n")
    assert not out.exists()  # no conversion was started
    assert demo_main(["--out", str(out), "--workers", "-1"]) == 2
    assert capsys.readouterr().err == ("train demo: error: argument --workers: must be an integer >= 0, got -1 "
                                       "(see python -m train demo --help)\n")
    assert not out.exists()


@pytest.mark.parametrize("argv, message", [
    (["--batch-size", "0"], "argument --batch-size: must be an integer >= 1, got 0"),
    (["--eval-clips", "nan"], "argument --eval-clips: expected an integer, got 'nan'"),
    (["--loader", "dali"], "argument --loader: invalid choice: 'dali' (choose from 'threads', 'processes')"),
    (["--export-to", "f.npz"], "unrecognized option --export-to; did you mean --export?"),
])
def test_eval_usage_errors_are_one_line(tmp_path, capsys, argv, message):
    assert eval_main(["--checkpoint", str(tmp_path / "c.pt"), "--data", str(tmp_path), *argv]) == 2
    assert capsys.readouterr().err == f"train eval: error: {message} (see python -m train eval --help)\n"


def test_settings_added_later_are_declared_with_the_value_old_checkpoints_load_with():
    assert added_later(TrainConfig) == {"order": "random", "order_block": 64, "order_window": 16, "order_shards": 4,
                                        "force_resume": False, "pad_last_batch": False, "cache_dir": None,
                                        "cache_limit": None, "model": "c3d", "inflate_from": None,
                                        "crop_scales": None, "sampling": "clips", "frame_step": 1,
                                        "short_side_scale": None, "random_resized_crop": None}


def test_a_config_checks_what_its_declarations_say():
    args = build_parser().parse_args(["--data", "x", "--batch-size", "8"])
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig) if hasattr(args, f.name)}
    given.update(workers=0, clip_len=16, device="cpu", amp="off", auto_batch=False, world_size=1, epoch_samples=40,
                 batch_size=None, steps_per_epoch=None, lr_plan=None)
    cfg = TrainConfig(**given).with_batch(8)
    refused: list[tuple[dict[str, Any], str]] = [
        ({"lr": float("nan")}, "--lr must be a finite number in [0, inf), got nan"),
        ({"verify_data": 1}, "--verify-data must be true or false, got 1"),
        ({"out": None}, "--out must be a string, got None"),
        ({"dist_backend": "mpi"}, "--dist-backend 'mpi': expected one of unset, nccl, gloo"),
        ({"warmup_steps": 1, "warmup_epochs": 1.0}, "--warmup-steps and --warmup-epochs: give one of them")]
    for change, message in refused:
        with pytest.raises(TrainError) as err:
            dataclasses.replace(cfg, **change)
        assert str(err.value) == message
    # A checkpoint's config from before --order: the declared values fill in what it lacks.
    old = {k: v for k, v in cfg.to_dict().items() if k not in added_later(TrainConfig)}
    assert TrainConfig.from_dict(old) == cfg and os.path.basename(cfg.out) == "c3d"


def test_every_command_reports_usage_errors_with_the_one_parser(tmp_path):
    """convert's commands and train's parse with one class: the same one line, the same closest-option hint."""
    for argv, prog in ((["convert", str(tmp_path / "src"), str(tmp_path / "out"), "--clip-lenn", "8"],
                        "python -m convert"),
                       (["convert", "verify", str(tmp_path / "out"), "--cache-limt", "1G"],
                        "python -m convert verify")):
        proc = subprocess.run([sys.executable, "-m", *argv], cwd=ROOT, env=subprocess_env(), capture_output=True,
                              text=True, timeout=120, check=False)
        hint = "--clip-len" if "verify" not in argv else "--cache-limit"
        assert proc.returncode == 2 and proc.stdout == "", proc.stderr
        assert proc.stderr == (f"{prog}: error: unrecognized option {argv[-2]}; did you mean {hint}? (see {prog} "
                               f"--help)\n")
    assert not (tmp_path / "out").exists()
