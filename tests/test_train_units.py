"""The trainer's parts without a training run: schedule, checkpoints, evaluation maths, plots, batch planning."""

from __future__ import annotations

import os
import random
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from train import TrainError, runfiles
from train import checkpoint as ckpt_io
from train.autobatch import find_batch_size, plan_batch
from train.metrics import EvalAccumulator, merge_eval
from train.plots import confusion_png, curves_png
from train.schedule import build_optimizer, build_scheduler, lr_factor, plan_lr, scaled_lr


def test_step_schedule_is_the_papers():
    # 0.003 per 30 clips, /10 every 4 epochs; 10 steps per epoch.
    assert scaled_lr(0.003, 30, 30, "linear") == pytest.approx(0.003)
    assert scaled_lr(0.003, 240, 30, "linear") == pytest.approx(0.024)
    assert scaled_lr(0.003, 240, 30, "none") == pytest.approx(0.003)
    kw: dict[str, Any] = dict(schedule="step", steps_per_epoch=10, total_steps=160, warmup_steps=0, step_epochs=4,
                              gamma=0.1)
    assert lr_factor(0, **kw) == 1.0 and lr_factor(39, **kw) == 1.0
    assert lr_factor(40, **kw) == pytest.approx(0.1)
    assert lr_factor(80, **kw) == pytest.approx(0.01)
    assert lr_factor(159, **kw) == pytest.approx(0.001)


def test_warmup_and_cosine():
    kw: dict[str, Any] = dict(schedule="cosine", steps_per_epoch=10, total_steps=100, warmup_steps=10, step_epochs=4,
                              gamma=0.1)
    assert lr_factor(0, **kw) == pytest.approx(0.1)
    assert lr_factor(9, **kw) == pytest.approx(1.0)
    assert lr_factor(55, **kw) == pytest.approx(0.5)
    assert lr_factor(100, **kw) == pytest.approx(0.0)
    model = torch.nn.Linear(2, 2)
    opt = build_optimizer(model, "sgd", 0.1, 0.9, 1e-4)
    assert [g["weight_decay"] for g in opt.param_groups] == [1e-4, 0.0]  # no decay on the bias
    sched = build_scheduler(opt, schedule="cosine", steps_per_epoch=10, epochs=10, warmup_steps=10, step_epochs=4,
                            gamma=0.1)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.01)
    for _ in range(9):
        opt.step()
        sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1)


def test_checkpoint_is_atomic_and_loads_weights_only(tmp_path):
    path = str(tmp_path / "checkpoint.pt")
    random.seed(3)
    np.random.seed(3)
    torch.manual_seed(3)
    rng = ckpt_io.rng_state()
    expected = (random.random(), float(np.random.rand()), torch.rand(3))
    ckpt_io.save_atomic({"model": {"w": torch.ones(2)}, "rng": [rng], "step": 5, "classes": ["a", "b"]}, path)
    assert sorted(os.listdir(tmp_path)) == ["checkpoint.pt"]  # no temporary file left behind
    loaded = ckpt_io.load(path)  # weights_only=True inside
    assert loaded["step"] == 5
    ckpt_io.set_rng_state(loaded["rng"][0])
    again = (random.random(), float(np.random.rand()), torch.rand(3))
    assert again[:2] == expected[:2] and torch.equal(again[2], expected[2])
    ckpt_io.check_classes(loaded, ["a", "b"], path)
    with pytest.raises(TrainError, match="trained on 2 classes, --data has 3"):
        ckpt_io.check_classes(loaded, ["a", "b", "c"], path)
    with pytest.raises(TrainError, match="not found"):
        ckpt_io.load(str(tmp_path / "nope.pt"))
    (tmp_path / ".checkpoint.pt.tmp.1234").write_bytes(b"half a checkpoint")  # left by a kill -9 mid-save
    assert runfiles.remove_stale_temps(str(tmp_path)) == [".checkpoint.pt.tmp.1234"]
    assert sorted(os.listdir(tmp_path)) == ["checkpoint.pt"]


class _Thing:
    pass


def test_checkpoint_with_objects_is_refused(tmp_path):
    path = str(tmp_path / "bad.pt")
    torch.save({"model": {}, "thing": _Thing()}, path)
    with pytest.raises(TrainError, match="weights_only"):
        ckpt_io.load(path)


def test_eval_merge_video_level_across_ranks():
    classes = ["a", "b", "c"]
    # Video v0 (label 0): clip 1 says class 1 strongly-ish, clips 2-3 say class 0; the clips sit on two ranks.
    r0, r1 = EvalAccumulator(3), EvalAccumulator(3)
    r0.add(torch.tensor([[0.0, 3.0, 0.0], [0.0, 0.0, 5.0]]), torch.tensor([0, 2]), ["v0", "v1"], 1.0)
    r1.add(torch.tensor([[2.0, 0.0, 0.0], [2.0, 0.0, 0.0], [0.0, 1.0, 0.0]]), torch.tensor([0, 0, 1]),
           ["v0", "v0", "v2"], 2.0)
    res = merge_eval([r0.state(), r1.state()], classes)
    assert res["clips"] == 5 and res["videos"] == 3
    assert res["clip_top1"] == pytest.approx(4 / 5)
    assert res["clip_top5"] == 1.0
    assert res["video_top1"] == 1.0  # v0's softmax average favours class 0
    assert res["loss"] == pytest.approx(3.0 / 5)
    assert res["confusion"] == [[1, 0, 0], [0, 1, 0], [0, 0, 1]]
    assert res["per_class"]["a"] == {"clip_acc": pytest.approx(2 / 3), "video_acc": 1.0, "clips": 3, "videos": 1}
    # Logit averaging can disagree with softmax averaging: check it is computed separately.
    r = EvalAccumulator(2)
    r.add(torch.tensor([[10.0, 0.0], [0.0, 2.0], [0.0, 2.0], [0.0, 2.0]]), torch.tensor([1, 1, 1, 1]), ["v"] * 4, 0.0)
    res = merge_eval([r.state()], ["x", "y"])
    assert res["video_top1_logits"] == 0.0 and res["video_top1"] == 1.0


@pytest.mark.parametrize("backend", ["pillow", "matplotlib"])
def test_figures(tmp_path, backend):
    if backend == "matplotlib":
        pytest.importorskip("matplotlib")
    cm = [[3, 1], [0, 4]]
    p = confusion_png(cm, ["up", "down"], str(tmp_path / "cm.png"), backend=backend)
    rows = [{"kind": "train", "step": s, "loss": 2.0 / s} for s in range(1, 20)]
    rows += [{"kind": "eval", "step": s, "clip_top1": s / 20, "video_top1": s / 19, "loss": 1.0} for s in (5, 10, 19)]
    q = curves_png(rows, str(tmp_path / "curves.png"), backend=backend)
    for path in (p, q):
        with Image.open(path) as im:
            assert im.format == "PNG" and im.size[0] > 100


def test_plan_batch_with_a_memory_model():
    base, per_clip, cap = 1000, 37, 10_000  # bytes: fixed + linear; real OOM beyond 11_000
    calls = []

    def peak(b):
        calls.append(b)
        used = base + per_clip * b
        return None if used > 11_000 else used

    best = plan_batch(peak, cap)
    assert best == (cap - base) // per_clip == 243
    assert len(calls) <= 6
    assert plan_batch(lambda b: None if b > 1 else 10, 100) == 1
    with pytest.raises(TrainError, match="not even one clip"):
        plan_batch(lambda b: None, 100)


def test_auto_batch_needs_cuda():
    with pytest.raises(TrainError, match="needs a CUDA device"):
        find_batch_size(torch.nn.Linear(1, 1), shape=(16, 112, 112), num_classes=2, device=torch.device("cpu"),
                        amp_dtype=None, channels_last=False)


def test_colour_permutation_is_keyed_by_clip_not_batch():
    from train.engine import colour_permutation

    x = torch.arange(3.0).view(1, 3, 1, 1, 1).expand(6, 3, 2, 2, 2).contiguous()
    idx = torch.tensor([3, 8, 1, 4, 7, 2])
    whole = colour_permutation(x, idx, epoch=2, seed=0)
    halves = torch.cat([colour_permutation(x[:3], idx[:3], epoch=2, seed=0),
                        colour_permutation(x[3:], idx[3:], epoch=2, seed=0)])
    assert torch.equal(whole, halves)  # the same clip gets the same colours however batches are cut
    for clip in whole:
        assert sorted(clip[:, 0, 0, 0].tolist()) == [0.0, 1.0, 2.0]  # a permutation, nothing lost
    seen = {tuple(c[:, 0, 0, 0].tolist()) for e in range(4) for c in colour_permutation(x, idx, epoch=e, seed=0)}
    assert len(seen) > 1


def _plan(**kw):
    base = dict(base_lr=0.003, global_batch=960, ref_batch=30, scaling="linear", max_lr=None, warmup_steps=None,
                warmup_epochs=None, steps_per_epoch=250, epochs=16, schedule="step", step_epochs=4.0)
    return plan_lr(**{**base, **kw})


def test_lr_scaling_cap_and_default_warmup():
    # 8 GPUs x 120 clips: linear scaling gives 0.003 x 960/30 = 0.096.
    p = _plan()
    assert p.lr == pytest.approx(0.096)
    # Default warm-up: min(5, 16/4, 4/2) = 2 epochs of 250 steps, ramping from --lr (0.003/0.096 = 1/32).
    assert p.warmup_steps == 500 and p.warmup_from == pytest.approx(1 / 32)
    assert "0.003 x 960/30 (linear scaling" in p.why and "warm-up 500 steps (2 epochs) from --lr 0.003" in p.why
    assert "\n" not in p.why
    kw: dict[str, Any] = dict(schedule="step", steps_per_epoch=250, total_steps=4000, warmup_steps=500,
                              step_epochs=4.0, gamma=0.1, warmup_from=1 / 32)
    assert lr_factor(0, **kw) == pytest.approx(1 / 32 + (31 / 32) / 500)  # first step: one 500th of the way
    assert lr_factor(249, **kw) == pytest.approx(1 / 32 + (31 / 32) * 250 / 500)
    assert lr_factor(499, **kw) == 1.0 and lr_factor(999, **kw) == 1.0
    assert lr_factor(1000, **kw) == pytest.approx(0.1)  # the step schedule goes on unchanged after the warm-up
    # Square-root scaling: 0.003 x sqrt(32); cosine schedule: the warm-up is min(5, 16/4) = 4 epochs.
    p = _plan(scaling="sqrt", schedule="cosine")
    assert p.lr == pytest.approx(0.003 * 32 ** 0.5) and p.warmup_steps == 1000
    assert p.warmup_from == pytest.approx(1 / 32 ** 0.5) and "sqrt(960/30)" in p.why
    # A long cosine run warms up 5 epochs (Goyal et al.), no more.
    assert _plan(schedule="cosine", epochs=100).warmup_steps == 1250
    # The cap: 0.05 instead of 0.096, warm-up from 0.003/0.05.
    p = _plan(max_lr=0.05)
    assert p.lr == 0.05 and p.warmup_from == pytest.approx(0.06) and p.why.startswith("lr 0.05: --max-lr caps")
    # No scaling, or a global batch at or below the reference: no warm-up unless asked.
    assert (_plan(scaling="none").lr, _plan(scaling="none").warmup_steps) == (0.003, 0)
    p = _plan(global_batch=16)
    assert p.lr == pytest.approx(0.0016) and p.warmup_steps == 0
    # An explicit warm-up wins and ramps from 0; 0 switches the default off.
    p = _plan(warmup_steps=100)
    assert (p.warmup_steps, p.warmup_from) == (100, 0.0)
    assert _plan(warmup_epochs=0.5).warmup_steps == 125
    assert _plan(warmup_steps=0).warmup_steps == 0
    with pytest.raises(TrainError, match="--max-lr must be positive"):
        _plan(max_lr=0)


def test_lr_scaling_options_parse():
    from train.args import build_parser

    parser = build_parser()
    assert parser.parse_args(["--data", "x"]).lr_scaling == "linear"
    assert parser.parse_args(["--data", "x", "--no-lr-scaling"]).lr_scaling == "none"
    assert parser.parse_args(["--data", "x", "--lr-scaling", "sqrt", "--max-lr", "0.1"]).max_lr == 0.1


class _FakeGpu:
    """Memory a trial step would peak at: fixed + per clip, recorded by the model's forward."""

    def __init__(self, total: int, base: int, per_clip: int) -> None:
        self.total_bytes, self.base, self.per_clip = total, base, per_clip
        self.last = 0
        self.resets = 0

    def __deepcopy__(self, memo):
        return self  # the probed copy of the model reports to the same fake device

    def total(self, device):
        return self.total_bytes

    def reset(self, device):
        self.resets += 1
        self.last = 0

    def peak(self, device):
        return self.last

    def release(self):
        pass


class _Fails(torch.nn.Module):
    """A model whose forward raises ``error`` for batches above ``limit`` clips."""

    benchmark_seen: list[bool] = []

    def __init__(self, gpu: _FakeGpu, limit: int, error: Exception) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(3, 4)
        self.gpu, self.limit, self.error = gpu, limit, error
        self.batches: list[int] = []

    def forward(self, x):
        n = x.shape[0]
        self.batches.append(n)
        _Fails.benchmark_seen.append(torch.backends.cudnn.benchmark)  # a class list: the probe runs a copy
        if n > self.limit:
            raise self.error
        self.gpu.last = self.gpu.base + self.gpu.per_clip * n
        return self.fc(x.mean(dim=(2, 3, 4)))


@pytest.mark.parametrize("error", [
    torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
    RuntimeError("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear if you passed in a "
                 "non-contiguous input."),
    RuntimeError("cuDNN error: CUDNN_STATUS_INTERNAL_ERROR"),
    RuntimeError("FIND was unable to find an engine to execute this computation"),
    RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
    RuntimeError("CUDA error: invalid configuration argument"),
    RuntimeError("Expected canUse32BitIndexMath(input) && canUse32BitIndexMath(output) to be true"),
    torch.AcceleratorError("CUDA error: invalid configuration argument\nCUDA kernel errors might be reported "
                           "asynchronously"),
], ids=["oom", "cudnn-not-supported", "cudnn-internal", "no-engine", "cublas-alloc", "launch-config", "int32-index",
        "accelerator-error"])
def test_auto_batch_treats_too_large_errors_as_does_not_fit(error):
    # Memory alone would allow (9000 - 1000) // 10 = 800 clips; the kernel fails above 37.
    gpu = _FakeGpu(total=10_000, base=1000, per_clip=10)
    model = _Fails(gpu, limit=37, error=error)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    torch.backends.cudnn.benchmark = True  # as the trainer sets it
    try:
        batch, details = find_batch_size(model, shape=(2, 4, 4), num_classes=4, device=torch.device("cpu"),
                                         amp_dtype=None, channels_last=False, headroom=0.9, accum_steps=2, memory=gpu)
        assert torch.backends.cudnn.benchmark is True  # restored after the search
        # every probe ran with cuDNN's autotuner off (on, each new batch size re-tunes every convolution)
        assert _Fails.benchmark_seen and not any(_Fails.benchmark_seen)
    finally:
        torch.backends.cudnn.benchmark = False
    assert details["micro_batch"] == 37 and batch == 74  # the largest that ran, times the accumulation steps
    assert details["probes"][2] == 1020 and details["probes"][4] == 1040 and details["probes"][37] == 1370
    assert all(details["probes"][b] is None for b in details["probes"] if b > 37)
    assert model.batches == []  # a copy was probed; the model itself never ran
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_auto_batch_reraises_other_errors():
    gpu = _FakeGpu(total=10_000, base=1000, per_clip=10)
    model = _Fails(gpu, limit=3, error=RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x8 and 3x4)"))
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        find_batch_size(model, shape=(2, 4, 4), num_classes=4, device=torch.device("cpu"), amp_dtype=None,
                        channels_last=False, memory=gpu)
    model = _Fails(gpu, limit=0, error=torch.cuda.OutOfMemoryError("CUDA out of memory"))
    with pytest.raises(TrainError, match="not even one clip fits"):
        find_batch_size(model, shape=(2, 4, 4), num_classes=4, device=torch.device("cpu"), amp_dtype=None,
                        channels_last=False, memory=gpu)


def test_ranks_agree_on_the_smallest_batch_with_one_reduction():
    from train.autobatch import agree_on_batch

    calls = []

    def reduce_min(ranks):
        def reduce(value):
            calls.append(value)
            return min([value, *ranks])
        return reduce

    assert agree_on_batch(48, reduce_min([40.0, 56.0])) == 40 and calls == [48.0]
    # A rank whose probe failed sends 0: it raises its own error, the others a pointer to it; nobody waits.
    with pytest.raises(TrainError, match="another rank found no batch"):
        agree_on_batch(48, reduce_min([0.0]))
    failed = TrainError("--batch-size auto: not even one clip fits on this GPU with the chosen settings")
    with pytest.raises(TrainError, match="not even one clip fits"):
        agree_on_batch(failed, reduce_min([48.0]))
    assert calls[-1] == 0.0
