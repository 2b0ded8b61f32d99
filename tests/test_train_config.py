"""TrainConfig: the run's settings resolved once into a frozen object, saved in the checkpoint and read back."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import pytest
import torch

import train.main
from train import TrainError
from train import checkpoint as ckpt_io
from train.args import build_parser, resolve_config
from train.config import TrainConfig
from train.dist import DistInfo
from train.evalcmd import main as eval_main
from train.main import main, run_argv

from .train_fixtures import CPU, common, cpu_config, final_state, tiny_data  # noqa: F401

ONE_STEP = ["--epochs", "1", "--max-steps", "1", "--batch-size", "8"]


def _plain(value) -> bool:
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return value is None or type(value) in (str, int, float, bool)


def test_resolution_gives_exact_values(tiny_data, tmp_path, monkeypatch):
    # 24 CPUs shared by LOCAL_WORLD_SIZE ranks decide the --workers defaults.
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(24)))
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    argv = [a for a in common(tiny_data, tmp_path) if a not in ("--workers", "0")] + ["--batch-size", "8"]
    cfg = cpu_config(argv)
    assert (cfg.device, cfg.amp, cfg.amp_dtype, cfg.dist_backend, cfg.world_size) == ("cpu", "off", None, None, 1)
    assert (cfg.loader, cfg.workers) == ("threads", 16)  # every core, at most 16 threads
    assert (cfg.clip_len, cfg.epoch_samples, cfg.steps_per_epoch, cfg.eval_batch_size) == (16, 40, 5, 8)
    assert cfg.lr_plan is not None
    assert cfg.lr_plan.lr == pytest.approx(0.003 * 8 / 30) and cfg.lr_plan.warmup_steps == 0
    assert cfg.model_crop == 32 and cfg.global_batch == 8 and not cfg.auto_batch and not cfg.verify_data
    assert cpu_config(argv + ["--loader", "processes"]).workers == 8  # one core fewer, at most 8
    with pytest.raises(TrainError, match="argument --loader: invalid choice: 'lmdb'"):  # retired before 0.1.0
        cpu_config(argv + ["--loader", "lmdb"])
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # four ranks on this node: 6 cores each
    assert cpu_config(argv).workers == 6 and cpu_config(argv + ["--loader", "processes"]).workers == 5
    assert cpu_config(argv + ["--workers", "3", "--amp", "bf16"]).workers == 3
    assert cpu_config(argv + ["--amp", "bf16"]).amp_dtype == torch.bfloat16
    # Two processes: each trains on 20 clips per epoch; the lr follows the global batch of 16.
    two = resolve_config(build_parser().parse_args(argv), DistInfo(1, 2, 1, CPU, "gloo"))
    assert (two.world_size, two.epoch_samples, two.steps_per_epoch, two.global_batch) == (2, 20, 2, 16)
    assert two.lr_plan is not None
    assert two.lr_plan.lr == pytest.approx(0.003 * 16 / 30) and two.dist_backend == "gloo"
    with pytest.raises(TrainError, match=r"an epoch gives each of the 2 process\(es\) 20 clips, fewer than one "
                                         r"batch of 21"):
        resolve_config(build_parser().parse_args(argv[:-1] + ["21"]), DistInfo(1, 2, 1, CPU, "gloo"))


def test_config_is_frozen_and_validates_with_allowed_values(tiny_data, tmp_path):
    cfg = cpu_config(common(tiny_data, tmp_path) + ["--batch-size", "8"])
    untyped: Any = cfg  # the assignment and the call the types forbid, which must fail at run time too
    with pytest.raises(dataclasses.FrozenInstanceError):
        untyped.batch_size = 16
    with pytest.raises(TypeError):
        type(untyped)(cfg.to_dict())  # keyword-only
    cases: list[tuple[dict[str, Any], str]] = [
        ({"loader": "lmdb"}, "--loader 'lmdb': expected one of threads, processes, dali"),
        ({"amp": "fp32"}, "--amp 'fp32': expected one of bf16, fp16, off"),
        ({"eval_protocol": "5x5"}, "--eval-protocol 5x5: 5 spatial crops is not one of 1, 3, 10"),
        ({"eval_protocol": "banana"}, "--eval-protocol banana: expected clips or NxM, e.g. 10x3, 4x3, 2x3, 8x1"),
        ({"workers": -1}, "--workers must be an integer >= 0, got -1"),
        ({"dropout": 1.0}, "--dropout must be in [0, 1), got 1.0"),
        ({"auto_headroom": 0.0}, "--auto-headroom must be in (0, 1], got 0.0"),
        ({"amp": "fp16"}, "--amp fp16 needs CUDA"),
        ({"device": "tpu"}, "--device 'tpu': expected cpu, cuda or cuda:N"),
        ({"batch_size": 9, "accum_steps": 2}, "--batch-size 9 is not divisible by --accum-steps 2"),
        ({"steps_per_epoch": 4}, "steps_per_epoch 4 is not epoch_samples 40 // batch_size 8"),
        ({"order": "sorted"}, "--order 'sorted': expected one of random, blocks"),
        ({"order_window": 0}, "--order-window must be an integer >= 1, got 0"),
        ({"order": "blocks", "loader": "dali"}, "--order blocks needs --loader threads or processes")]
    for change, message in cases:
        with pytest.raises(TrainError) as err:
            dataclasses.replace(cfg, **change)
        assert str(err.value).startswith(message) and "\n" not in str(err.value), (change, str(err.value))
    with pytest.raises(TrainError, match="the batch is resolved already"):
        cfg.with_batch(16)
    with pytest.raises(TrainError, match=r"config lacks lr_plan, seed; has unknown settings colour \(written by"):
        TrainConfig.from_dict({**{k: v for k, v in cfg.to_dict().items() if k not in ("seed", "lr_plan")},
                               "colour": True})


def test_auto_batch_is_the_one_late_step(tiny_data, tmp_path, monkeypatch, capsys):
    argv = common(tiny_data, tmp_path / "auto") + ["--epochs", "1", "--max-steps", "1", "--batch-size", "auto",
                                                  "--eval-batch-size", "5"]
    pending = cpu_config(argv)
    assert pending.auto_batch and (pending.batch_size, pending.steps_per_epoch, pending.lr_plan) == (None,) * 3
    assert pending.eval_batch_size == 5
    done = pending.with_batch(16)
    assert (done.batch_size, done.steps_per_epoch, done.eval_batch_size) == (16, 2, 5)
    assert done.lr_plan is not None
    assert done.lr_plan.lr == pytest.approx(0.003 * 16 / 30)
    assert pending.batch_size is None  # a new object; the pending one is unchanged
    assert dataclasses.replace(done, batch_size=16) == done
    # In the trainer: the probe (faked here: it needs CUDA) answers 16, and the run trains with it.
    probed = []

    def fake_probe(model, **kw):
        probed.append(kw["shape"])
        return 16, {"micro_batch": 16, "batch": 16, "total_bytes": 2**34}

    monkeypatch.setattr(train.main, "find_batch_size", fake_probe)
    summary = run_argv(argv)
    assert probed == [(16, 32, 32)] and summary["batch_size"] == 16
    assert "--batch-size auto: 16 clips per process (micro-batch 16, peak <= 85% of 16 GiB, amp off)" in \
        capsys.readouterr().out
    saved = TrainConfig.from_dict(final_state(tmp_path / "auto")["config"])
    assert saved == done


def test_config_round_trips_through_the_checkpoint(tiny_data, tmp_path):
    argv = common(tiny_data, tmp_path / "run") + ONE_STEP + ["--verify-data", "--warmup-epochs", "0.5"]
    run_argv(argv)
    saved = final_state(tmp_path / "run")  # weights_only=True inside
    assert "args" not in saved and _plain(saved["config"])
    cfg = TrainConfig.from_dict(saved["config"])
    assert cfg == cpu_config(argv) and cfg.to_dict() == saved["config"]
    assert cfg.lr_plan is not None
    assert cfg.verify_data and cfg.lr_plan.warmup_steps == 2  # half an epoch of 5 steps, rounded
    assert ckpt_io.check_settings(saved, cpu_config(argv), "ckpt") == cfg


def test_checkpoint_without_a_config_fails_in_one_line(tiny_data, tmp_path, capsys):
    out = tmp_path / "run"
    run_argv(common(tiny_data, out) + ONE_STEP)
    path = ckpt_io.latest_path(str(out))
    old = ckpt_io.load(path)
    cfg = old.pop("config")
    # As the trainer wrote them before TrainConfig: the parsed options, filtered to plain values.
    old["args"] = {k: v for k, v in cfg.items() if k in ("model_width", "bn", "crop_size", "downsample", "seed")}
    old["args"]["clip_len"] = None
    os.unlink(path)  # a hard link to the step file: write a new file instead of through it
    for _, step_file in ckpt_io.step_files(str(out)):
        os.unlink(step_file)
    ckpt_io.save_atomic(old, path)
    capsys.readouterr()
    assert main(common(tiny_data, out) + ["--epochs", "1", "--max-steps", "2", "--batch-size", "8", "--resume"]) == 2
    err = capsys.readouterr().err.strip()
    expected = (f"checkpoint {path} comes from an older python -m train (its settings are saved as 'args', without "
                f"a 'config'): continue it with the trainer that wrote it, or start a new run from its weights with "
                f"--finetune {path}")
    assert err == f"train: error: {expected}"
    assert ckpt_io.load(path)["step"] == 1  # left alone
    assert eval_main(["--checkpoint", path, "--data", tiny_data, "--device", "cpu", "--workers", "0"]) == 2
    assert capsys.readouterr().err.strip() == f"train eval: error: {expected}"
    # Its weights still start a new run.
    run_argv(common(tiny_data, tmp_path / "ft") + ONE_STEP + ["--lr", "0", "--finetune", path])
    assert torch.equal(final_state(tmp_path / "ft")["model"]["fc8.weight"], old["model"]["fc8.weight"])
