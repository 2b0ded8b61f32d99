"""The loops: ``train_one_epoch`` and ``evaluate`` (the shape of torchvision's video reference)."""

from __future__ import annotations

import contextlib
import itertools
import math
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
from torch import nn

from loaders import to_model_input
from loaders.keyed import keyed_uniform

from . import dist
from .checkpoint import rng_state, set_rng_state
from .data import EvalData, TrainData
from .errors import TrainError
from .gpustats import GpuStats, format_gpu
from .heartbeat import Heartbeat
from .metrics import EvalAccumulator, MetricsLog, merge_eval, peak_memory_mb

if TYPE_CHECKING:
    from torch.nn.parallel import DistributedDataParallel

    from .config import TrainConfig
    from .models import VideoModel

# The training loss: (logits, labels) -> a scalar; an nn.Module (CrossEntropyLoss) or a plain function.
Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class TrainState:
    """Progress counters that go into the checkpoint."""

    step: int = 0  # optimizer steps done in the whole run
    epoch: int = 0  # the epoch in progress (or the next one, at a boundary)
    epoch_step: int = 0  # optimizer steps done in this epoch
    nonfinite: int = 0  # steps whose loss was inf or NaN (fp16: skipped by the GradScaler)


@dataclass
class BestTracker:
    """The best validation video top-1 so far, its step, and evaluations since (for ``--early-stop``)."""

    patience: int | None = None
    best: float | None = None
    best_step: int | None = None
    since: int = 0  # evaluations without improvement since the best

    def update(self, value: float, step: int) -> bool:
        """Record an evaluation; True when it is a new best (strictly better)."""
        if self.best is None or value > self.best:
            self.best, self.best_step, self.since = value, step, 0
            return True
        self.since += 1
        return False

    @property
    def exhausted(self) -> bool:
        return self.patience is not None and self.since >= self.patience

    def state_dict(self) -> dict:
        return {"best": self.best, "best_step": self.best_step, "since": self.since}

    def load_state_dict(self, state: dict | None) -> None:
        if state:
            self.best, self.best_step, self.since = state["best"], state["best_step"], int(state["since"])


class StopRequest:
    """Set by a signal handler (SIGTERM/SIGINT/SIGHUP/SIGUSR1: preemption, Ctrl-C, a closed terminal); the loop
    stops at the next step boundary, or sooner where ``stop_checks`` are in place (see there)."""

    def __init__(self) -> None:
        self.signal: str | None = None

    def handler(self, signum: int, frame: Any) -> None:
        self.signal = signal.Signals(signum).name


class Interrupted(Exception):
    """A stop signal (``signal``, its name) cut a training step or an evaluation short; nothing of it is kept."""

    def __init__(self, signal_name: str) -> None:
        super().__init__(f"stopped by {signal_name}")
        self.signal = signal_name


@contextlib.contextmanager
def stop_checks(model: nn.Module, stop: StopRequest | None, *, backward: bool = True) -> Iterator[None]:
    """While in the block, ``Interrupted`` is raised as soon as ``stop`` is set: before the forward of each of
    ``model``'s modules and, with ``backward``, as each parameter's gradient is computed.

    Why: Python runs a signal handler only when the main thread executes
    Python code, and a step of full-size C3D on a CPU is minutes spent in
    torch's C++ (a backward pass is one call). The hooks are Python code
    between layers, forward and backward (on the CPU autograd runs them in
    the calling thread), so the handler runs and the step ends within one
    layer's computation. Raised from these hooks only, never from the handler,
    so nothing outside the model's computation is cut short.
    """
    if stop is None:
        yield
        return

    def check(*_: Any) -> None:
        if stop.signal is not None:
            raise Interrupted(stop.signal)

    def on_grad(grad: torch.Tensor) -> None:
        check()

    handles = [m.register_forward_pre_hook(check) for m in model.modules()]
    if backward:
        handles += [p.register_hook(on_grad) for p in model.parameters() if p.requires_grad]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


class StepStart:
    """What a step changes before its update, taken as the step starts so that an abandoned step leaves no
    trace: every RNG stream (dropout draws from them) and the model's buffers (BatchNorm's running statistics,
    which each micro-batch's forward updates)."""

    def __init__(self, model: nn.Module) -> None:
        self.rng = rng_state()
        self.buffers = [(b, b.detach().clone()) for b in model.buffers()]

    @torch.no_grad()
    def restore(self) -> None:
        for buffer, saved in self.buffers:
            buffer.copy_(saved)
        set_rng_state(self.rng)


@dataclass
class StepConfig:
    """What one optimizer step needs besides the model and data."""

    device: torch.device
    amp_dtype: torch.dtype | None  # None: no autocast
    accum_steps: int
    channels_last: bool = False
    downsample: int = 1
    colour_perm_seed: int | None = None  # None: off
    clip_grad_norm: float | None = None
    max_steps: int | None = None
    ckpt_every: int = 0
    log_every: int = 10
    progress: bool = False
    main: bool = True  # this rank prints notes
    stop: StopRequest | None = None
    gpu: GpuStats | None = None  # NVML utilisation and memory (this rank's GPU), when available
    # FLOPs of one clip's training step (3 forward passes: train.models.flops_per_clip) and the GPU's peak
    # FLOP/s (gpustats.peak_flops): the log's achieved TFLOP/s and MFU, where known.
    step_flops: float | None = None
    peak_flops: float | None = None
    profiler: Any = None  # profiling.StepProfiler: told of each step
    # A stop signal abandons the step in progress (stop_checks) instead of waiting for its end: one process
    # only, uncompiled (under torchrun every rank must stop at the same step, which they agree on at its end).
    stop_within_step: bool = False
    heartbeat: Heartbeat | None = None  # a progress line now and then where no progress bar is shown

    @classmethod
    def from_config(cls, cfg: TrainConfig, *, main: bool = True, progress: bool = False,
                    stop: StopRequest | None = None, gpu: GpuStats | None = None, profiler: Any = None,
                    heartbeat: Heartbeat | None = None, step_flops: float | None = None,
                    peak_flops: float | None = None) -> StepConfig:
        """The step settings of a run's ``TrainConfig`` (resolved in this process), with this process's helpers."""
        return cls(device=torch.device(cfg.device), amp_dtype=cfg.amp_dtype, accum_steps=cfg.accum_steps,
                   channels_last=cfg.channels_last, downsample=cfg.downsample,
                   colour_perm_seed=cfg.seed if cfg.colour_permutation else None, clip_grad_norm=cfg.clip_grad_norm,
                   max_steps=cfg.max_steps, ckpt_every=cfg.ckpt_every, log_every=cfg.log_every, progress=progress,
                   main=main, stop=stop, gpu=gpu, profiler=profiler, step_flops=step_flops, peak_flops=peak_flops,
                   stop_within_step=cfg.world_size == 1 and not cfg.compile, heartbeat=heartbeat)


def model_input(clips: torch.Tensor, mean: Sequence[float], std: Sequence[float], device: torch.device,
                channels_last: bool, downsample: int = 1) -> torch.Tensor:
    """uint8 (N, T, H, W, C) -> normalised float (N, C, T, H, W) on ``device``, optionally pooled 2D."""
    x: torch.Tensor = to_model_input(clips, mean=mean, std=std, device=device, channels_last=channels_last)
    if downsample > 1:
        # Spatial average pooling after the crop: a cheap low-resolution input for CPU demos.
        x = nn.functional.avg_pool3d(x, (1, downsample, downsample))
    return x


_PERMS = torch.tensor(list(itertools.permutations(range(3))))


def colour_permutation(x: torch.Tensor, index: torch.Tensor, epoch: int, seed: int) -> torch.Tensor:
    """Permute the RGB channels of each clip, chosen by (seed, epoch, clip index).

    For data whose colours are a nuisance (the synthetic demo: random colours
    per video let a small model memorise videos instead of learning motion).
    Keyed like the loader's crops, so ranks, workers and resumes see the same.
    """
    # KeyedDraws(seed, epoch, 0xC0, i) for every clip index i of the batch, in one vectorised call.
    u = keyed_uniform((seed, epoch, 0xC0), index.cpu().numpy())
    perm = _PERMS[torch.from_numpy((u * len(_PERMS)).astype(np.int64))].to(x.device)
    return x[torch.arange(x.shape[0], device=x.device)[:, None], perm]


def _autocast(device: torch.device, dtype: torch.dtype | None) -> torch.autocast:
    return torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None)


def train_one_epoch(model: nn.Module, ddp: DistributedDataParallel | None, criterion: Loss,
                    optimizer: torch.optim.Optimizer, scheduler: Any, scaler: torch.amp.GradScaler,
                    data: TrainData, state: TrainState, cfg: StepConfig, log: MetricsLog,
                    save: Callable[[TrainState], None], world_size: int = 1) -> str | None:
    """Run the rest of ``state.epoch``; returns why it stopped early (``"max_steps"``, ``"signal SIGTERM"``) or None.

    Either way the checkpoint of the last step is saved before returning.

    ``model`` is what is called (maybe compiled), ``ddp`` the DistributedDataParallel
    wrapper inside it or None. A batch is one optimizer step for this rank; it
    is split into ``accum_steps`` micro-batches and only the last backward
    all-reduces, the others run under ``ddp.no_sync()``.

    A stop signal ends the epoch after the step in progress; with
    ``cfg.stop_within_step`` (one process) and a loader that can save behind
    what it has read (``data.rewinds``) it abandons that step within a layer
    (``stop_checks``): the RNG and the model's buffers go back to the step's
    start (``StepStart``), and the checkpoint is the previous step's, which a
    resume continues from exactly as if the step had never begun.
    """
    model.train()
    device = cfg.device
    remaining = data.steps_per_epoch - state.epoch_step
    bar = None
    if cfg.progress:
        from tqdm import tqdm

        bar = tqdm(total=data.steps_per_epoch, initial=state.epoch_step, desc=f"epoch {state.epoch + 1}",
                   dynamic_ncols=True, leave=False)
    loss_acc = torch.zeros((), device=device)
    window = {"steps": 0, "finite": 0, "wait": 0.0, "start": time.perf_counter()}
    it = iter(data)
    stop = None
    within = cfg.stop is not None and cfg.stop_within_step and data.rewinds
    checks = stop_checks(model, cfg.stop) if within else contextlib.nullcontext()
    with checks:
        for _ in range(remaining):
            start = StepStart(model) if within else None
            t0 = time.perf_counter()
            try:
                with torch.profiler.record_function("loader_wait"):
                    batch = next(it)
            except StopIteration:  # a reader with fewer batches than announced: end the epoch here
                break
            window["wait"] += time.perf_counter() - t0
            optimizer.zero_grad(set_to_none=True)
            try:
                step_loss = _forward_backward(model, ddp, criterion, scaler, batch, data, state, cfg)
            except Interrupted as exc:
                if start is not None:
                    start.restore()
                optimizer.zero_grad(set_to_none=True)
                stop = exc.signal
                if window["steps"]:
                    _log_window(loss_acc, window, optimizer, scaler, data, state, cfg, log, bar, world_size)
                save(state)  # the previous step's checkpoint: the abandoned one is redone on resume
                break
            finite, stop = _step_flags(step_loss, scaler, state, cfg)
            if finite:
                loss_acc += step_loss
                window["finite"] += 1
            if cfg.clip_grad_norm:
                scaler.unscale_(optimizer)
                nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_grad_norm)
            scaler.step(optimizer)
            scaler.update()
            scheduler.step()
            state.step += 1
            state.epoch_step += 1
            window["steps"] += 1
            if bar is not None:
                bar.update(1)
            if cfg.profiler is not None:
                cfg.profiler.step()
            if cfg.heartbeat is not None:
                cfg.heartbeat.at_step(state.step, state.epoch)
            at_max = cfg.max_steps is not None and state.step >= cfg.max_steps
            if window["steps"] >= cfg.log_every or at_max or stop or state.epoch_step == data.steps_per_epoch:
                _log_window(loss_acc, window, optimizer, scaler, data, state, cfg, log, bar, world_size)
                loss_acc.zero_()
                window = {"steps": 0, "finite": 0, "wait": 0.0, "start": time.perf_counter()}
            if at_max or stop:
                save(state)
                break
            if cfg.ckpt_every and state.step % cfg.ckpt_every == 0:
                save(state)
    if bar is not None:
        bar.close()
    if stop:
        return f"signal {stop}"
    return "max_steps" if cfg.max_steps is not None and state.step >= cfg.max_steps else None


def _forward_backward(model: nn.Module, ddp: DistributedDataParallel | None, criterion: Loss,
                      scaler: torch.amp.GradScaler, batch: dict, data: TrainData, state: TrainState,
                      cfg: StepConfig) -> torch.Tensor:
    """The micro-batches of one step, forward and backward; returns the step's loss (the gradients accumulate)."""
    device = cfg.device
    clips, labels = batch["clip"], batch["label"]
    step_loss = torch.zeros((), device=device)
    # Micro-batch j takes clips j, j + A, j + 2A, ... (A = accum_steps), not a contiguous slice: the samplers deal
    # an epoch's order to ranks the same way (rank r takes clips r, r + world, ...), so micro-batch j holds the
    # clips, in their order, that rank j would hold in a run with A times the ranks and 1/A of the batch. One
    # process with --accum-steps 2 then computes the very gradients (bit for bit) of two ranks under DDP, which
    # is what makes DDP testable exactly (tests/test_train_run.py).
    a = cfg.accum_steps
    chunks = [(clips[j::a], labels[j::a], batch["index"][j::a]) for j in range(min(a, len(labels)))]
    for j, (xc, yc, ic) in enumerate(chunks):
        last = j == len(chunks) - 1
        sync = contextlib.nullcontext() if (ddp is None or last) else ddp.no_sync()
        with sync:
            x = model_input(xc, data.mean, data.std, device, cfg.channels_last, cfg.downsample)
            if cfg.colour_perm_seed is not None:
                x = colour_permutation(x, ic, state.epoch, cfg.colour_perm_seed)
            y = yc.to(device, non_blocking=True)
            with _autocast(device, cfg.amp_dtype):
                out = model(x)
            # Loss in float32 and divided by the micro-batch count, so the
            # accumulated gradient is the mean over the whole batch.
            loss = criterion(out.float(), y) / len(chunks)
            scaler.scale(loss).backward()
        step_loss += loss.detach()
    return step_loss


def _step_flags(step_loss: torch.Tensor, scaler: torch.amp.GradScaler, state: TrainState,
                cfg: StepConfig) -> tuple[bool, str | None]:
    """(this step's loss is finite on every rank, the signal that asks every rank to stop, or None).

    One host sync per step (the loss value), and under torchrun one tiny
    all-reduce, so every rank takes the same branch at the same step: a signal
    that reached one rank stops them all after this step. A non-finite loss is
    counted. With fp16 it gives non-finite gradients, which the GradScaler skips
    (and lowers its scale for), so the step is noted and the run goes on; it is
    not added to the logged loss. With bf16 or fp32 nothing would stop it
    poisoning the weights: the run stops before the update, naming the step.
    """
    value = float(step_loss)
    asked = cfg.stop.signal if cfg.stop is not None else None
    signum = float(signal.Signals[asked].value) if asked else 0.0
    bad, signum = dist.all_reduce([0.0 if math.isfinite(value) else 1.0, signum], cfg.device, op="max")
    stop = signal.Signals(int(signum)).name if signum else None
    if not bad:
        return True, stop
    state.nonfinite += 1
    # Epochs counted from 1 for people, as the progress lines and the resume line count them.
    where = f"step {state.step + 1} (epoch {state.epoch + 1}, step {state.epoch_step + 1} of it)"
    if not scaler.is_enabled():
        amp = {torch.bfloat16: "bf16", None: "off"}.get(cfg.amp_dtype, str(cfg.amp_dtype))
        raise TrainError(f"non-finite training loss ({value}) at {where} with --amp {amp}; stopped before the "
                         f"update. Lower --lr (or set --max-lr), add --clip-grad-norm, and resume from the last "
                         f"checkpoint")
    if cfg.main:
        print(f"note: non-finite training loss ({value}) at {where}; the fp16 GradScaler skips its update "
              f"({state.nonfinite} such step(s) in this run)", flush=True)
    return False, stop


def _log_window(loss_acc: torch.Tensor, window: dict, optimizer: torch.optim.Optimizer,
                scaler: torch.amp.GradScaler, data: TrainData, state: TrainState, cfg: StepConfig,
                log: MetricsLog, bar: Any, world_size: int) -> None:
    if cfg.device.type == "cuda":
        torch.cuda.synchronize(cfg.device)  # so the window's wall time covers its GPU work
    elapsed = time.perf_counter() - window["start"]
    steps = window["steps"]
    # One collective on every rank: summed loss, summed wait and the slowest rank's time.
    loss_sum, wait_sum = dist.all_reduce([float(loss_acc), window["wait"]], cfg.device)
    (slowest,) = dist.all_reduce([elapsed], cfg.device, op="max")
    record = {
        "kind": "train", "step": state.step, "epoch": state.epoch + state.epoch_step / data.steps_per_epoch,
        # Mean over the window's finite steps (a skipped fp16 step adds nothing to loss_sum).
        "loss": loss_sum / (window["finite"] * world_size) if window["finite"] else float("nan"),
        "lr": optimizer.param_groups[0]["lr"],
        "clips_per_s": steps * data.batch_size * world_size / max(slowest, 1e-9),
        "data_wait_frac": wait_sum / world_size / max(elapsed, 1e-9),
        "step_time_s": elapsed / steps, "peak_mem_mb": peak_memory_mb(cfg.device),
        **data.loader_stats(),  # this rank's loader: loader_clips_per_s, loader_queue_depth where known
    }
    if cfg.step_flops:
        record["tflops"] = record["clips_per_s"] * cfg.step_flops / 1e12  # all ranks together
        if cfg.peak_flops:
            record["mfu"] = record["clips_per_s"] * cfg.step_flops / (cfg.peak_flops * world_size)
    if scaler.is_enabled():
        record["grad_scale"] = float(scaler.get_scale())
    if state.nonfinite:
        record["nonfinite_steps"] = state.nonfinite
    gpu = cfg.gpu.sample() if cfg.gpu is not None else {}
    record.update(gpu)
    log.log(record)
    if cfg.heartbeat is not None:
        cfg.heartbeat.loss(record["loss"])
    if bar is not None:
        extra = {"gpu": format_gpu(gpu)[4:]} if gpu else {}
        bar.set_postfix(loss=f"{record['loss']:.3f}", lr=f"{record['lr']:.2e}",
                        clips_s=f"{record['clips_per_s']:.1f}", wait=f"{record['data_wait_frac']:.0%}", **extra)


@torch.no_grad()
def evaluate(model: nn.Module, data: EvalData, device: torch.device, amp_dtype: torch.dtype | None, *,
             channels_last: bool = False, downsample: int = 1, progress: bool = False,
             features: bool = False, stop: StopRequest | None = None) -> dict[str, Any]:
    """Clip and video accuracy over all of ``data``, gathered from every rank.

    ``model`` must be the plain module, not the DDP wrapper: ranks hold
    different numbers of clips, and DDP's forward may talk to the other ranks.
    With ``features`` the per-video means of the model's video features (``features_and_logits``: C3D's fc6
    and fc7, the others' pooled features) go into ``video_scores`` too.
    A signal that sets ``stop`` ends the evaluation within a layer (``stop_checks``; the ranks do not talk
    until the gather at the end, so each may stop where it is): every rank then raises ``Interrupted``.
    """
    was_training = model.training
    model.eval()
    acc = EvalAccumulator(len(data.classes))
    criterion = nn.CrossEntropyLoss(reduction="sum")
    with torch.random.fork_rng(devices=[]):  # loader start-up must not move the training RNG
        it = iter(data.loader)
    if progress:
        from tqdm import tqdm

        it = tqdm(it, desc="eval", leave=False, dynamic_ncols=True)
    cut: str | None = None
    with stop_checks(model, stop, backward=False):
        try:
            for batch in it:
                x = model_input(batch["clip"], data.mean, data.std, device, channels_last, downsample)
                y = batch["label"].to(device, non_blocking=True)
                feats: dict[str, torch.Tensor] | None = None
                with _autocast(device, amp_dtype):
                    if features:
                        feats, logits = cast("VideoModel", model).features_and_logits(x)
                    else:
                        logits = model(x)
                logits = logits.float()
                acc.add(logits, y, list(batch["video_id"]), float(criterion(logits, y)), feats)
        except Interrupted as exc:
            cut = exc.signal
    gathered = dist.all_gather_object((acc.state(), cut))
    model.train(was_training)
    asked = next((signal_name for _, signal_name in gathered if signal_name), None)
    if asked is not None:
        raise Interrupted(asked)
    result = merge_eval([state for state, _ in gathered], data.classes, keep_scores=True)
    result["protocol"] = dict(data.protocol)
    return result
