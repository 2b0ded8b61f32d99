"""The trainer tests' tiny converted dataset and helpers, shared by the tests/test_train_*.py modules.

Test modules import ``tiny_data`` by name; the conversion is cached here, in
the module, so it runs once per session however many modules use it.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections import OrderedDict

import pytest
import torch
from torch import nn

from train import checkpoint as ckpt_io
from train.config import TrainConfig

from .conftest import ROOT

CPU = torch.device("cpu")
_BUILT: dict[str, str] = {}


def free_port() -> int:
    """A TCP port of 127.0.0.1 free now (for a process group's MASTER_PORT)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def as_torchrun_rank(rank: int, world: int, port: int) -> None:
    """This process as rank ``rank`` of ``world`` on one node, with torchrun's environment (gloo, one thread)."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> str:
    """40 clips (20 videos x 2) of 16 x 40 x 52, five classes."""
    from convert.synth import synthetic_conversions
    from convert.worker.plan import ConvertConfig

    if "tiny" not in _BUILT:
        base = tmp_path_factory.getbasetemp() / "train_tiny"
        path = synthetic_conversions(str(base), {"train": ConvertConfig(size=(40, 52), max_clips=2)}, per_class=4,
                                     seconds=2.0, seed=7, videos="videos/train", workers=2)["train"]
        with open(os.path.join(path, "manifest.json")) as f:
            clips = sum(s["clips"] for s in json.load(f)["shards"])
        if clips != 40:
            raise RuntimeError(f"tiny dataset has {clips} clips, the tests assume 40")
        _BUILT["tiny"] = path
    return _BUILT["tiny"]


@pytest.fixture(scope="session")
def tiny_tfrecord(tiny_data) -> str:
    """The videos of ``tiny_data`` as a TFRecord conversion of raw clips (40 clips, which DALI's native reader
    reads on its CPU backend too)."""
    return tiny_as("tfrecord", tiny_data)


def tiny_as(backend: str, tiny_data: str) -> str:
    """The videos of ``tiny_data`` converted with ``backend`` (raw clips, 40 of them; ``tiny_data`` itself for
    LMDB), made once per session beside it."""
    from convert.synth import synthetic_conversions
    from convert.worker.plan import ConvertConfig

    if backend == "lmdb":
        return tiny_data
    if backend not in _BUILT:
        base = os.path.dirname(tiny_data)
        _BUILT[backend] = synthetic_conversions(
            base, {backend: ConvertConfig(backend=backend, codec="raw", size=(40, 52), max_clips=2)},
            per_class=4, seconds=2.0, seed=7, videos="videos/train", workers=2)[backend]
    return _BUILT[backend]


def common(data: str, out) -> list[str]:
    """Options every test run shares: width 1/16, 32x32 crops, one thread, no loader workers, CPU."""
    return ["--data", data, "--out", str(out), "--model-width", "0.0625", "--crop-size", "32", "--workers", "0",
            "--threads", "1", "--no-progress", "--no-tensorboard", "--log-every", "1", "--device", "cpu"]


def final_state(out) -> dict:
    return ckpt_io.load(ckpt_io.latest_path(str(out)))


def assert_states_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def resumed_equals_unbroken(data: str, tmp_path, args: list[str], *, stop: int = 3) -> tuple[dict, dict]:
    """Train ``args`` on ``data`` unbroken (``tmp_path/a``), and stopped after ``stop`` steps then resumed
    (``tmp_path/b``); assert both end at the same step with the same weights, bit for bit. Returns both final
    states."""
    from train.main import run_argv

    run_argv(common(data, tmp_path / "a") + args)
    run_argv(common(data, tmp_path / "b") + args + ["--max-steps", str(stop)])
    run_argv(common(data, tmp_path / "b") + args + ["--resume"])
    a, b = final_state(tmp_path / "a"), final_state(tmp_path / "b")
    assert a["step"] == b["step"]
    assert_states_equal(a["model"], b["model"])
    return a, b


def one_line_error(capsys) -> str:
    """The message ``python -m train`` printed, after asserting stderr is one ``train: error:`` line."""
    err = capsys.readouterr().err.strip()
    assert err.startswith("train: error: ") and "\n" not in err, err
    return err[len("train: error: "):]


def subprocess_env() -> dict[str, str]:
    """The environment for a ``python -m train`` child that imports this worktree's code."""
    return {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}


def cpu_config(argv: list[str]) -> TrainConfig:
    """``python -m train ARGV``'s resolved TrainConfig for one process on the CPU (what ``run`` builds)."""
    from train.args import build_parser, resolve_config
    from train.dist import DistInfo

    return resolve_config(build_parser().parse_args(argv), DistInfo(0, 1, 0, CPU, None))


class _Sleep(torch.autograd.Function):
    """The identity, slow both ways (as a layer of full-size C3D is on a CPU): ``seconds`` forward and backward."""

    @staticmethod
    def forward(ctx, x, seconds):
        ctx.seconds = seconds
        time.sleep(seconds)
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        time.sleep(ctx.seconds)
        return grad, None


class _SlowLayer(nn.Module):
    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def forward(self, x):
        # On the meta device (the trainer counting FLOPs at start) nothing runs, so nothing sleeps.
        return x if x.is_meta else _Sleep.apply(x, self.seconds)


def slow_c3d(calls: list[float], seconds: float):
    """A C3D class (patched in as the registry's ``c3d`` builder) with four slow identity layers of ``seconds``
    each way: no weights of their own, so its state dict is C3D's. ``calls`` gets the time of each forward."""
    from train.models.c3d import C3D

    class SlowC3D(C3D):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            layers = OrderedDict()
            for name, layer in self.features.named_children():
                layers[name] = layer
                if name in ("conv1_relu", "conv2_relu", "conv3b_relu", "conv5b_relu"):
                    layers[name.replace("_relu", "_slow")] = _SlowLayer(seconds)
            self.features = nn.Sequential(layers)

        def forward(self, x):
            if not x.is_meta:  # the trainer's FLOP count at start is not a step
                calls.append(time.monotonic())
            return super().forward(x)

    return SlowC3D
