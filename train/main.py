"""``main``: build everything, resume if asked, train, evaluate, write results."""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import random
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, cast

import numpy as np
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from convert.signals import put_back, take_stop_signals

from . import checkpoint as ckpt_io
from . import dist, runfiles
from .args import build_parser, check_model_input, crop_size, resolve_config
from .autobatch import agree_on_batch, find_batch_size
from .config import TrainConfig
from .data import (
    DataShape,
    EvalData,
    TrainData,
    build_eval_data,
    build_train_data,
    cache_settings,
    dali_builder,
    dataset_info,
)
from .engine import BestTracker, Interrupted, StepConfig, StopRequest, TrainState, evaluate, train_one_epoch
from .errors import TrainError
from .gpustats import GpuStats, peak_flops
from .heartbeat import Heartbeat
from .metrics import MetricsLog, read_metrics
from .models import build_model as build_network
from .models import flops_per_clip, inflate_into, load_for_finetuning, model_spec, read_state_dict
from .plots import confusion_png, save_figures
from .profiling import StepProfiler
from .readerrors import reading
from .schedule import build_optimizer, build_scheduler
from .workers import STOP_SIGNALS, end_workers_at_exit


def _say(info: dist.DistInfo, text: str) -> None:
    if info.is_main:
        print(text, flush=True)


def _steps(n: int) -> str:
    return f"{n} step" if n == 1 else f"{n} steps"


def epochs_done(epoch: int, epoch_step: int, steps_per_epoch: int | None) -> int:
    """Whole epochs trained, from the stored state: ``epoch`` (the epoch in progress, counted from 0) plus the
    one whose last step is done when the run stopped right after it (``--max-steps`` at an epoch's end stops
    before the state moves on to the next epoch)."""
    return epoch + (1 if steps_per_epoch and epoch_step >= steps_per_epoch else 0)


def run_position(step: int, epoch: int, epoch_step: int, steps_per_epoch: int | None) -> str:
    """Where a run stands, for people: "step 12 (epoch 3, 2 steps into it)", or at an epoch's end "step 10 (the
    end of epoch 2)". Epochs are counted from 1, as the progress lines count them; the stored state counts
    them from 0."""
    done = epochs_done(epoch, epoch_step, steps_per_epoch)
    if epoch_step == 0 and epoch == 0:
        return f"step {step} (the start of epoch 1)"
    if epoch_step == 0 or done > epoch:
        return f"step {step} (the end of epoch {done})"
    return f"step {step} (epoch {epoch + 1}, {_steps(epoch_step)} into it)"


def save_eval(out: str, name: str, result: dict[str, Any]) -> dict[str, str]:
    """``OUT/eval/NAME.json`` and the confusion matrix beside it as a PNG (``runfiles.eval_files``)."""
    js, png = runfiles.eval_files(out, name)
    os.makedirs(os.path.dirname(js), exist_ok=True)
    with open(js, "w") as f:
        json.dump({k: v for k, v in result.items() if k != "video_scores"}, f, indent=1)
    confusion_png(result["confusion"], result["classes"], png, title=f"video-level confusion ({name})")
    return {"json": js, "confusion_png": png}


def eval_line(result: dict[str, Any]) -> str:
    """The protocol and the accuracies of one evaluation, in one line."""
    return (f"({result['protocol']['name']}: {result['protocol']['text']}): clip top-1 {result['clip_top1']:.3f}, "
            f"top-5 {result['clip_top5']:.3f}, video top-1 {result['video_top1']:.3f}, top-5 "
            f"{result['video_top5']:.3f} ({result['videos']} videos, {result['clips']} views)")


def model_options(cfg: TrainConfig) -> dict[str, Any]:
    """The ``--model``'s options as ``cfg`` sets them (``width``, and ``bn``/``dropout`` where it takes them)."""
    given = {"width": cfg.model_width, "bn": cfg.bn, "dropout": cfg.dropout}
    return {name: given[name] for name in model_spec(cfg.model).options}


def build_model(cfg: TrainConfig, classes: list[str], info: dist.DistInfo, *, resuming: bool = False) -> nn.Module:
    """The ``--model`` for these classes (``train.models.build_model``), with ``--finetune``'s or
    ``--inflate-from``'s weights unless ``resuming``, on this rank's device."""
    # Same seed on every rank for the weights (DDP copies rank 0's anyway).
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    inflate = cfg.inflate_from if not resuming else None
    try:
        model = build_network(cfg.model, num_classes=len(classes), clip_len=cfg.clip_len, crop_size=cfg.model_crop,
                              **model_options(cfg))
    except ValueError as exc:  # an input too small for the model (a clip length the data decided, or a resume)
        raise TrainError(f"--clip-len {cfg.clip_len} --crop-size {cfg.crop_size} --downsample {cfg.downsample}: "
                         f"{exc}") from exc
    spec = model_spec(cfg.model)
    if inflate:
        # After building, as --finetune: the model's own init draws stay those of a run without it.
        try:
            left = inflate_into(model, read_state_dict(inflate), classifier=spec.classifier)
        except ValueError as exc:
            raise TrainError(f"--inflate-from {inflate}: {exc}") from exc
        _say(info, f"inflated from the 2-D weights {inflate}; newly initialised: {', '.join(left) or 'nothing'}")
    if cfg.finetune and not resuming:
        try:
            weights = ckpt_io.load_named(cfg.finetune, say=lambda text: _say(info, text))
            left = load_for_finetuning(model, ckpt_io.model_state(weights), classifier=spec.classifier)
        except ValueError as exc:
            raise TrainError(f"--finetune {cfg.finetune}: {exc}") from exc
        _say(info, f"fine-tuning from {cfg.finetune}; newly initialised: {', '.join(left) or 'nothing'}")
    model.to(info.device)
    if cfg.channels_last:
        model.to(memory_format=torch.channels_last_3d)  # type: ignore[call-overload]  # torch's stub lacks it
    # Per-rank streams from here on, so ranks draw different dropout masks.
    torch.manual_seed(cfg.seed + 1000 * info.rank)
    random.seed(cfg.seed + 1000 * info.rank)
    np.random.seed(cfg.seed + 1000 * info.rank)
    return model


def auto_batch(cfg: TrainConfig, model: nn.Module, num_classes: int, info: dist.DistInfo) -> tuple[int, dict]:
    """(the largest batch every rank can hold, the probe's details) for ``--batch-size auto``.

    Each rank probes its own GPU alone (the model is not yet SyncBatchNorm- or
    DDP-wrapped, so no trial step waits on another rank), then one all-reduce
    takes the minimum; a rank whose probe failed sends 0 and all ranks stop.
    """
    local: int | TrainError
    try:
        local, details = find_batch_size(model, shape=(cfg.clip_len, cfg.model_crop, cfg.model_crop),
                                         num_classes=num_classes, device=info.device, amp_dtype=cfg.amp_dtype,
                                         channels_last=cfg.channels_last, headroom=cfg.auto_headroom,
                                         accum_steps=cfg.accum_steps)
    except TrainError as exc:
        local, details = exc, {}
    batch = agree_on_batch(local, lambda v: dist.all_reduce([v], info.device, op="min")[0])
    _say(info, f"--batch-size auto: {batch} clips per process (micro-batch {batch // cfg.accum_steps}, peak <= "
               f"{cfg.auto_headroom:.0%} of {details['total_bytes'] / 2**30:.0f} GiB, amp {cfg.amp})")
    return batch, details


def check_resume(path: str, saved: dict[str, Any], cfg: TrainConfig, shape: DataShape) -> None:
    """Refuse, in one line, a resume of checkpoint ``saved`` (read from ``path``) that this run cannot continue:
    other classes, a setting that decides the weights' shapes, or (unless ``--force-resume``) other data or
    settings that decide it. Before anything is built, so a refused resume costs no work."""
    ckpt_io.check_classes(saved, shape.classes, path)
    ckpt_io.check_settings(saved, cfg, path, data=shape.identity)


def resume(path: str, saved: dict[str, Any], cfg: TrainConfig, parts: dict[str, Any], data: TrainData, shape: DataShape,
           info: dist.DistInfo) -> tuple[TrainState, dict | None]:
    """Load checkpoint ``saved`` (read from ``path``, checked by ``check_resume``) into model/optimizer/scaler/
    scheduler and the sampler, and print what changed since it was saved.

    Returns the progress and this rank's RNG state (None when the world size or batch changed).
    """
    check_resume(path, saved, cfg, shape)  # again: --batch-size auto resolved the batch since
    before = ckpt_io.saved_config(saved, path)
    changed = ckpt_io.changed_settings(before, cfg)
    recorded = saved.get("data")
    if recorded is None:
        _say(info, f"note: checkpoint {path} records no identity of its data (saved before checkpoints did): "
                   f"--data is not compared with it")
    elif dict(recorded) != dict(shape.identity):  # let through by --force-resume
        changed.append(f"the data ({ckpt_io.describe_data(recorded)} -> {ckpt_io.describe_data(shape.identity)})")
    if changed:
        _say(info, "changed since the checkpoint: " + ", ".join(changed))
    for name, obj in parts.items():
        try:
            obj.load_state_dict(saved[name])
        except (KeyError, RuntimeError, ValueError) as exc:  # a setting the checkpoint does not record
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise TrainError(f"checkpoint {path}: its {name} state does not fit this run ({first})") from exc
    state = TrainState(step=saved["step"], epoch=saved["epoch"], epoch_step=saved["epoch_step"],
                       nonfinite=int(saved.get("nonfinite", 0)))
    sampler_state, moved = elastic_sampler_state(saved, before, cfg, state, native=not data.rewinds)
    try:
        data.load_state_dict(sampler_state)
    except ValueError as exc:  # a sampler state of a scheme or size this loader does not draw
        raise TrainError(f"checkpoint {path}: its sampler state does not fit this run ({exc})") from exc
    # Every rank's own RNG stream goes on; on another world size or batch they restart (the note says so).
    rng = None if moved else saved["rng"][info.rank]
    if moved:
        _say(info, moved)
    _say(info, f"resumed from {path} at "
               f"{run_position(state.step, state.epoch, state.epoch_step, cfg.steps_per_epoch)}")
    return state, rng


def elastic_sampler_state(saved: dict[str, Any], before: TrainConfig, cfg: TrainConfig, state: TrainState, *,
                          native: bool = False) -> tuple[dict[str, Any], str]:
    """(the sampler state this run loads, a note for the log: "" when the world size and the per-process batch
    are the checkpoint's) for resuming checkpoint ``saved`` (saved with ``before``) into ``state``.

    With the world size and the per-process batch unchanged, the saved state
    as it is. Otherwise (elastic resume: another number of processes and/or
    another per-process batch) the ranks together have used the first
    ``epoch_step * global_batch`` samples of the epoch's global order, which
    does not depend on the rank count; ``state.epoch_step`` becomes the whole
    steps of the new global batch in that, and the sampler's position the
    new per-rank share of it. With the same global batch that is the same
    global position: over the two runs every clip of the epoch is read once.
    Another global batch resumes at the last whole new step before it, so up
    to one new global batch of clips is read again; and RNG streams restart
    (there is no RNG state for a rank that did not exist).
    """
    sampler = dict(saved["sampler"])
    if before.world_size == cfg.world_size and before.batch_size == cfg.batch_size:
        return sampler, ""
    if before.batch_size is None or cfg.batch_size is None:  # both resolved before a resume loads anything
        raise TrainError("a resume needs the batch resolved (with_batch) on both sides")
    consumed = saved["epoch_step"] * before.batch_size * before.world_size
    state.epoch_step = consumed // cfg.global_batch
    at = state.epoch_step * cfg.global_batch
    sampler.update(position=state.epoch_step * cfg.batch_size, world_size=cfg.world_size, global_position=at,
                   global_batch=cfg.global_batch)
    note = (f"note: {before.world_size} -> {cfg.world_size} process(es), batch {before.batch_size} -> "
            f"{cfg.batch_size} per process (global {before.batch_size * before.world_size} -> {cfg.global_batch}): "
            f"epoch {state.epoch + 1} goes on at sample {at} of its order ({state.epoch_step} steps in); RNG "
            f"streams restart")
    if at != consumed:
        note += f"; the global batch changed, so {consumed - at} clips of the epoch are read again"
    if native and consumed and "read" not in sampler:
        note += ("; the checkpoint does not record which clips DALI's native reader had read (saved before "
                 "checkpoints did), so the rest of this epoch is not the exact complement of what was read")
    elif native and consumed:
        note += "; DALI's native reader reads the clips of the epoch not read yet through the source route"
    return sampler, note


@contextlib.contextmanager
def stop_signals(stop: StopRequest) -> Iterator[None]:
    """SIGTERM, SIGINT, SIGHUP and SIGUSR1 ask the loop to save and stop (preemption on clusters, Ctrl-C, a
    closed terminal or a dropped SSH session): at the next step boundary, or within the step in one process
    (``engine.stop_checks``).

    Installed only in the main thread (where Python delivers signals); the
    previous handlers come back afterwards, for library callers. A signal the
    process was started ignoring stays ignored (``take_stop_signals``): a run
    started under ``nohup`` goes on when its terminal closes, as asked.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = take_stop_signals(stop.handler, STOP_SIGNALS)
    try:
        yield
    finally:
        put_back(previous)


def wrap(model: nn.Module, cfg: TrainConfig, info: dist.DistInfo) -> tuple[nn.Module, DistributedDataParallel | None]:
    """(module to call, DDP wrapper or None): DDP across ranks, then torch.compile if asked."""
    ddp = None
    if info.distributed:
        ddp = DistributedDataParallel(model, device_ids=[info.device.index] if info.device.type == "cuda" else None,
                                      bucket_cap_mb=cfg.ddp_bucket_mb,
                                      gradient_as_bucket_view=cfg.grad_as_bucket_view)
        model = ddp
    if cfg.compile:
        model = cast(nn.Module, torch.compile(model))
    return model, ddp


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Train as the parsed options say; returns a summary (final evaluation, speed, where files went).

    The start of every training run, in one process or under torchrun (``main``,
    ``run_argv``, the demo): DataLoader workers still alive at exit are ended
    then (``end_workers_at_exit``), ``--threads`` holds for the run
    (``torch_threads``), and the process group is torn down afterwards, after
    an error too.
    """
    end_workers_at_exit()
    try:
        with torch_threads(args.threads):
            return _train(args)
    finally:
        dist.cleanup()


def _train(args: argparse.Namespace) -> dict[str, Any]:
    # The options are resolved once into a frozen TrainConfig (train.config); everything below reads
    # that, and the checkpoint stores it.
    info = dist.init_distributed(args.device, args.dist_backend)
    device = info.device
    # Checks the folder (or URL) first.
    if not args.resume:
        # A clip or crop too small for --model: refused before anything is read. A resumed run first compares
        # them with its checkpoint's (check_resume), which names what the checkpoint was saved with; building the
        # model checks them after that, before a clip is read.
        check_model_input(args)
    shape = dataset_info(args.data, crop_size(args), cache=cache_settings(args))
    classes = shape.classes
    cfg = resolve_config(args, info, shape)
    if cfg.loader == "dali":
        dali_builder()  # not installed: say so before anything else
        if device.type != "cuda":
            # Otherwise nothing would say that DALI is not on a GPU here: the run works, on DALI's CPU backend.
            _say(info, f"note: --loader dali on the CPU (device {device}: no GPU in this run): DALI reads and crops "
                       f"on its CPU backend, not on a GPU")
    if cfg.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = not cfg.deterministic
    held = ckpt_io.describe_run(cfg.out)
    if held and not cfg.resume and not cfg.overwrite:
        raise TrainError(f"--out {cfg.out} holds a run ({held}): pass --resume to continue it, --overwrite to "
                         f"start it again (every file of that run is removed), or another --out")
    os.makedirs(cfg.out, exist_ok=True)
    if info.is_main:
        runfiles.remove_stale_temps(cfg.out)  # from a save that a kill interrupted
        if cfg.overwrite and not cfg.resume:
            # All of the previous run, not only what makes the folder hold one: its curves, summary or
            # evaluations left beside the new run's files would be read as the new run's.
            runfiles.remove_run(cfg.out)
    dist.barrier()

    # The checkpoint to resume is chosen (the newest that loads, passes its checksum and is whole) and checked
    # against this run before anything is built.
    def say(text: str) -> None:
        _say(info, text)

    def resumable(ckpt: dict[str, Any], path: str) -> str | None:
        ckpt_io.check_classes(ckpt, classes, path)  # not one file's damage: other classes stop the search
        return ckpt_io.resume_problem(ckpt)

    found = ckpt_io.newest_complete(cfg.out, say, check=resumable) if cfg.resume else None
    if found is not None:
        check_resume(*found, cfg, shape)
    model = build_model(cfg, classes, info, resuming=found is not None)
    auto = None
    if cfg.auto_batch:
        batch, auto = auto_batch(cfg, model, len(classes), info)
        cfg = cfg.with_batch(batch)  # the one late step: the probe needed the model
    if cfg.sync_bn and info.distributed:  # a no-op on a model without BatchNorm (c3d without --bn)
        # After the auto-batch probe, which must not run collectives: SyncBatchNorm's forward is one.
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    # The loaders are closed when the run ends, by an error too: a DALI pipeline's threads and the
    # reader threads would otherwise live until garbage collection, which an exception's traceback
    # (holding the frames that hold the loaders) can put off indefinitely.
    with contextlib.ExitStack() as open_loaders:
        data = build_train_data(cfg, info)
        open_loaders.callback(data.close)
        if data.classes != classes:
            raise TrainError("the training loader's classes differ from the manifest's")
        if data.steps_per_epoch != cfg.steps_per_epoch:
            raise TrainError(f"the training loader gives {data.steps_per_epoch} steps per epoch where the config "
                             f"expects {cfg.steps_per_epoch} (a bug in the trainer: please report it)")
        val = build_eval_data(cfg.val_data, cfg, info) if cfg.val_data else None
        if val is not None:
            open_loaders.callback(val.close)
        if val is not None and val.classes != classes:
            raise TrainError(f"--val-data has classes {val.classes[:5]}{'...' if len(val.classes) > 5 else ''} "
                             f"({len(val.classes)}), --data has {classes[:5]}{'...' if len(classes) > 5 else ''} "
                             f"({len(classes)}): label numbers would differ; {ckpt_io.CLASSES_HINT}")

        plan, steps = cfg.lr_plan, cfg.steps_per_epoch
        batch_size = cfg.batch_size
        if plan is None or steps is None or batch_size is None:  # with_batch sets them, above
            raise TrainError("the LR plan waits for the batch (--batch-size auto): resolve it first (with_batch)")
        optimizer = build_optimizer(model, cfg.optimizer, plan.lr, cfg.momentum, cfg.weight_decay)
        scheduler = build_scheduler(optimizer, schedule=cfg.schedule, steps_per_epoch=steps, epochs=cfg.epochs,
                                    warmup_steps=plan.warmup_steps, step_epochs=cfg.lr_step_epochs,
                                    gamma=cfg.lr_gamma, warmup_from=plan.warmup_from)
        # One code path: a disabled scaler passes scale/step/update straight through.
        scaler = torch.amp.GradScaler(device.type, enabled=cfg.amp == "fp16", init_scale=cfg.init_scale,
                                      growth_interval=cfg.growth_interval)
        parts: dict[str, Any] = {"model": model, "optimizer": optimizer, "scaler": scaler, "scheduler": scheduler}
        latest = ckpt_io.latest_path(cfg.out)
        state, rng = TrainState(), None
        tracker = BestTracker(cfg.early_stop)
        reached = None  # the limit a resumed run had already reached: nothing left to train
        if found is not None:
            state, rng = resume(*found, cfg, parts, data, shape, info)
            tracker.load_state_dict(found[1].get("best"))
            if (epochs_done(state.epoch, state.epoch_step, steps) >= cfg.epochs
                    or (cfg.max_steps and state.step >= cfg.max_steps)):
                reached = (f"--max-steps {cfg.max_steps}" if cfg.max_steps and state.step >= cfg.max_steps
                           else f"--epochs {cfg.epochs}")
                _say(info, f"note: the run in {cfg.out} already reached {reached} at "
                           f"{run_position(state.step, state.epoch, state.epoch_step, steps)}: nothing left to "
                           f"train; raise {reached.split()[0]} to go on")
        elif cfg.resume:
            _say(info, f"--resume: no checkpoint in {cfg.out} yet, starting fresh")
        resumed = found is not None
        wrapped, ddp = wrap(model, cfg, info)  # what is called; ``model`` stays the module itself

        log = MetricsLog(cfg.out, info.is_main, tensorboard=not cfg.no_tensorboard)
        log.start(state.step if resumed else None)
        profiler = StepProfiler(cfg.out, cfg.profile, info.rank, device) if cfg.profile else None
        stop = StopRequest()
        total = min(cfg.epochs * steps, cfg.max_steps or cfg.epochs * steps)
        # Without a terminal there is no progress bar: a line every HEARTBEAT_S seconds shows the run is alive.
        heartbeat = (Heartbeat(total=total, steps_per_epoch=steps, epochs=cfg.epochs, step=state.step)
                     if info.is_main and not cfg.no_progress and not sys.stdout.isatty() else None)
        step_cfg = StepConfig.from_config(cfg, main=info.is_main, stop=stop, profiler=profiler,
                                          progress=info.is_main and not cfg.no_progress and sys.stderr.isatty(),
                                          gpu=GpuStats(device) if info.is_main else None, heartbeat=heartbeat,
                                          step_flops=3 * flops_per_clip(cfg.model, num_classes=len(classes),
                                                                        clip_len=cfg.clip_len,
                                                                        crop_size=cfg.model_crop,
                                                                        **model_options(cfg)),
                                          peak_flops=peak_flops(device))

        saved_step = [state.step if resumed else -1]  # the step of the newest checkpoint in OUT
        # The newest checkpoint known whole (written by this run, or the one resumed from): what a failed save's
        # message names as intact, rather than any file in OUT (a damaged one the resume skipped may be newer).
        intact = [found[0] if found is not None else None]

        def save(st: TrainState) -> None:
            # Every rank's RNG goes in, so each rank resumes its own dropout stream.
            saved_step[0] = st.step
            rngs = dist.all_gather_object(ckpt_io.rng_state())
            position = data.state_dict(consumed=st.epoch_step * batch_size)
            merge = getattr(data.loader, "merge_rank_states", None)
            if merge is not None:  # DALI's native reader: which clips every rank has read (elastic resume)
                position = merge(dist.all_gather_object(position))
            if info.is_main:
                ckpt_io.save_checkpoint({
                    **{name: obj.state_dict() for name, obj in parts.items()},
                    "step": st.step, "epoch": st.epoch, "epoch_step": st.epoch_step, "nonfinite": st.nonfinite,
                    # Where the epoch stands, for this world size and for any other (elastic resume): this rank's
                    # position, the global position over all ranks, the world size and the global batch.
                    "sampler": {**position, "global_batch": cfg.global_batch},
                    "best": tracker.state_dict(),
                    "rng": rngs, "classes": classes, "data": dict(shape.identity),
                    "data_fingerprint": shape.fingerprint, "config": cfg.to_dict(),
                }, cfg.out, st.step, cfg.keep_last, previous=intact[0])
            intact[0] = ckpt_io.step_path(cfg.out, st.step)  # every rank: each names it when its reader fails

        _say(info, f"{cfg.model} width {cfg.model_width} on {len(classes)} classes | {info.world_size} process(es) on "
                   f"{device.type} | batch {cfg.batch_size}/process (accum {cfg.accum_steps}), global "
                   f"{cfg.global_batch} | lr {plan.lr:.3g} ({cfg.schedule}) | amp {cfg.amp} | "
                   f"{cfg.steps_per_epoch} steps/epoch | loader {cfg.loader}")
        _say(info, f"data {cfg.data}: content fingerprint "
                   f"{shape.fingerprint or 'none (converted before fingerprints were recorded)'}")
        _say(info, plan.why)
        if rng is not None:
            ckpt_io.set_rng_state(rng)  # last, after anything that might draw (model init, DDP, compile)
        criterion = nn.CrossEntropyLoss(label_smoothing=cfg.label_smoothing)

        def evaluated(name: str) -> tuple[int, dict, dict]:
            """Evaluate on --val-data, count it for --early-stop and the best checkpoint, save this step's
            checkpoint (with the tracker's new state) and point checkpoint_best.pt at it when it is the best so
            far: every evaluation alike, the final one included. ``Interrupted`` by a stop signal: nothing kept."""
            if val is None:
                raise TrainError("an evaluation needs --val-data")
            if heartbeat is not None:
                heartbeat.phase("evaluating")
            result = _eval_and_log(model, val, state, cfg, step_cfg, log, info, name, lambda: intact[0])
            if heartbeat is not None:
                heartbeat.phase("training")
            improved = tracker.update(result[1]["video_top1"], state.step)
            save(state)
            if improved and info.is_main:
                ckpt_io.link_best(cfg.out, state.step)
            return result

        t_start = time.perf_counter()
        start_step = state.step
        last_eval = None
        stopped = None
        with stop_signals(stop), heartbeat if heartbeat is not None else contextlib.nullcontext():
            try:
                while state.epoch < cfg.epochs and not (cfg.max_steps and state.step >= cfg.max_steps):
                    data.set_epoch(state.epoch)
                    data.set_position(state.epoch_step * batch_size)
                    with reading("--data", cfg.data, lambda: state.step, lambda: intact[0]):
                        stopped = train_one_epoch(wrapped, ddp, criterion, optimizer, scheduler, scaler, data,
                                                  state, step_cfg, log, save, world_size=info.world_size)
                    if stopped:
                        break  # --max-steps or a signal; train_one_epoch saved the checkpoint
                    state.epoch += 1
                    state.epoch_step = 0
                    if val is not None and cfg.eval_every and state.epoch % cfg.eval_every == 0:
                        last_eval = evaluated(runfiles.epoch_eval_name(state.epoch))
                    else:
                        save(state)
                    if tracker.exhausted:
                        stopped = (f"early stop: validation video top-1 has not improved on {tracker.best:.4f} "
                                   f"(step {tracker.best_step}) in {tracker.since} evaluations")
                        _say(info, stopped)
                        break
                train_s = time.perf_counter() - t_start
                interrupted = bool(stopped and stopped.startswith("signal"))
                if val is not None and not interrupted and (last_eval is None or last_eval[0] != state.step):
                    last_eval = evaluated(runfiles.FINAL_EVAL)
            except Interrupted as exc:  # an evaluation cut short: this step's checkpoint is kept, or saved now
                train_s = time.perf_counter() - t_start
                if saved_step[0] != state.step:
                    save(state)
                stopped = f"signal {exc.signal}"
        if profiler is not None:
            _say(info, profiler.close())

        # "epoch": whole epochs trained (the stored state's epoch is the one in progress, which --max-steps at an
        # epoch's end leaves one behind).
        summary: dict[str, Any] = {"out": cfg.out, "is_main": info.is_main, "checkpoint": latest, "metrics": log.path,
                                   "step": state.step, "start_step": start_step, "reached": reached,
                                   "epoch": epochs_done(state.epoch, state.epoch_step, steps),
                                   "steps_per_epoch": steps, "train_seconds": train_s, "batch_size": cfg.batch_size,
                                   "nonfinite_steps": state.nonfinite, "stopped": stopped, "auto_batch": auto,
                                   "best": tracker.state_dict() | {"checkpoint": ckpt_io.best_path(cfg.out)},
                                   "config": cfg.to_dict()}
        if last_eval is not None:
            summary["eval_step"], summary["eval"], summary["eval_files"] = last_eval
        if info.is_main:
            summary.update(_speed(read_metrics(log.path)))
            summary["curves"] = save_figures(cfg.out, read_metrics(log.path))
            with open(os.path.join(cfg.out, runfiles.SUMMARY), "w") as f:
                json.dump({k: v for k, v in summary.items() if k != "eval"}, f, indent=1, default=str)
        log.close()
        dist.barrier()
        return summary


def print_summary(summary: dict[str, Any], per_class: bool = False) -> None:
    """What a finished run did and where its files are (what ``python -m train`` and the demo print)."""
    print()
    step, start = summary["step"], summary.get("start_step", 0)
    trained = step - start
    speed = summary.get("clips_per_s") if trained else None  # a run that trained nothing has no speed of its own
    epochs = f"{summary['epoch']} epoch{'' if summary['epoch'] == 1 else 's'}"
    if summary.get("reached"):
        reached = summary["reached"]
        print(f"nothing left to train: the run had already reached {reached} (step {step}, {epochs}); raise "
              f"{reached.split()[0]} to go on")
    else:
        # The run's steps first (what scripts/container_check.sh looks for after a resume), then this process's.
        done = f"({epochs})" if not start else f"({trained} in this run, from step {start}; {epochs})"
        print(f"trained {_steps(step)} {done} in {summary['train_seconds']:.0f} s"
              + (f" ({speed:.1f} clips/s" if speed else "")
              + (f", data wait {summary['data_wait_frac']:.0%}" if speed else "")
              + (f", MFU {summary['mfu']:.1%}" if speed and "mfu" in summary else "")
              + (f", GPU busy {summary['gpu_util_pct']:.0f}%" if speed and "gpu_util_pct" in summary else "")
              + (")" if speed else ""))
    stopped = summary.get("stopped") or ""
    signal_name = stopped.split()[1] if stopped.startswith("signal") else None
    if signal_name:
        print(f"stopped by {signal_name} at step {step}: checkpoint saved; run the same command "
              f"with --resume to continue")
    elif stopped.startswith("early stop"):
        print(f"{stopped}; best checkpoint: {summary['best']['checkpoint']}")
    if summary.get("nonfinite_steps"):
        print(f"non-finite loss in {summary['nonfinite_steps']} step(s) (skipped by the fp16 GradScaler)")
    ev = summary.get("eval")
    if ev is not None:
        at = summary.get("eval_step", step)
        label = "validation" if at == step else f"validation (the last evaluation, at step {at})"
        print(f"{label}: clip top-1 {ev['clip_top1']:.1%}, video top-1 {ev['video_top1']:.1%}, video top-5 "
              f"{ev['video_top5']:.1%} ({ev['videos']} videos, {ev['clips']} clips; chance "
              f"{1 / len(ev['classes']):.1%})")
        if per_class:
            for name, pc in ev["per_class"].items():
                print(f"  {name:12s} video acc {pc['video_acc']:.0%}  clip acc {pc['clip_acc']:.0%}")
    elif (summary.get("config") or {}).get("val_data"):
        if signal_name:
            print(f"validation: not run: the run was stopped by {signal_name} before evaluating on "
                  f"--val-data (--resume continues it, and evaluates when it ends)")
        else:
            print("validation: not run")
    else:
        print("validation: none (pass --val-data to evaluate)")
    print(f"checkpoint:        {summary['checkpoint']}")
    print(f"metrics:           {summary['metrics']}")
    print(f"curves:            {summary['curves']}")
    if ev is not None:
        print(f"eval results:      {summary['eval_files']['json']}")
        print(f"confusion matrix:  {summary['eval_files']['confusion_png']}")


def _speed(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Medians over the logged windows (the first window holds start-up costs)."""
    train_rows = [r for r in rows if r.get("kind") == "train"]
    if not train_rows:
        return {}
    out = {"clips_per_s": float(np.median([r["clips_per_s"] for r in train_rows])),
           "data_wait_frac": float(np.median([r["data_wait_frac"] for r in train_rows])),
           "peak_mem_mb": max(r["peak_mem_mb"] for r in train_rows), "final_loss": train_rows[-1]["loss"]}
    for key in ("tflops", "mfu"):  # where the FLOPs (and the GPU's peak) are known
        values = [r[key] for r in train_rows if key in r]
        if values:
            out[key] = float(np.median(values))
    util = [r["gpu_util_pct"] for r in train_rows if "gpu_util_pct" in r]
    if util:  # NVML (nvidia-ml-py) was there
        out["gpu_util_pct"] = float(np.median(util))
        out["gpu_mem_used_mb"] = max(r["gpu_mem_used_mb"] for r in train_rows if "gpu_mem_used_mb" in r)
    return out


def _eval_and_log(model: nn.Module, val: EvalData, state: TrainState, cfg: TrainConfig, step_cfg: StepConfig,
                  log: MetricsLog, info: dist.DistInfo, name: str,
                  last: Callable[[], str | None]) -> tuple[int, dict, dict]:
    """Evaluate on --val-data at this step, log it, save its files and print its line (``last``: the run's
    newest intact checkpoint, which a store that stops answering names)."""
    with reading("--val-data", cfg.val_data or "", lambda: state.step, last):
        result = evaluate(model, val, step_cfg.device, step_cfg.amp_dtype, channels_last=step_cfg.channels_last,
                          downsample=step_cfg.downsample, progress=step_cfg.progress, stop=step_cfg.stop)
    files: dict[str, str] = {}
    if info.is_main:
        files = save_eval(cfg.out, name, result)
        log.log({"kind": "eval", "step": state.step, "epoch": state.epoch,
                 **{k: v for k, v in result.items() if isinstance(v, (int, float)) and v is not None},
                 "file": files["json"]})
        print(f"eval @ step {state.step} {eval_line(result)}", flush=True)
    return state.step, result, files


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status (2 with a one-line message for usage and setup errors, 1 with one for
    a failure of the machine such as a full disk: ``MachineError``)."""
    try:
        summary = run_argv(argv)
    except TrainError as exc:
        print(f"train: error: {exc}", file=sys.stderr)
        return exc.status
    if summary.get("is_main"):
        try:
            print_summary(summary)
        except OSError as exc:
            if exc.errno != errno.EIO:
                raise
            # The terminal hung up (SIGHUP: its window closed, its SSH session dropped): the run saved and wrote
            # its files, and nobody is left to read the summary. What is still buffered for the terminal goes
            # nowhere, rather than failing the exit with a traceback and status 120.
            null = os.open(os.devnull, os.O_WRONLY)
            for fd in (1, 2):
                os.dup2(null, fd)
            os.close(null)
    return 0


@contextlib.contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """``--threads`` (when given) for the duration of the block; the previous setting comes back after it,
    so library callers get theirs back."""
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def run_argv(argv: list[str] | None = None) -> dict[str, Any]:
    """Parse ``argv`` (default: the command line) as ``python -m train`` does and train; returns ``run``'s
    summary, raises TrainError (for a usage error too, in one line)."""
    return run(build_parser().parse_args(argv))
