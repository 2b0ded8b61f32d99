"""``main``: build everything, resume if asked, train, evaluate, write results."""

from __future__ import annotations

import json
import os
import random
import sys
import time
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from . import checkpoint as ckpt_io
from . import dist
from .args import build_parser, check_args, default_workers
from .autobatch import find_batch_size
from .data import build_eval_data, build_train_data, check_dataset, dali_builder
from .engine import StepConfig, TrainState, evaluate, train_one_epoch
from .errors import TrainError
from .metrics import MetricsLog, read_metrics
from .model import C3D, load_for_finetuning
from .plots import confusion_png, save_figures
from .profiling import StepProfiler
from .schedule import build_optimizer, build_scheduler, effective_lr

AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "off": None}


def dataset_info(root: str) -> tuple[list[str], tuple[int, int, int]]:
    """Class names and stored clip shape (T, H, W) from a conversion's manifest."""
    with open(os.path.join(root, "manifest.json")) as f:
        manifest = json.load(f)
    shape = manifest.get("clip_shape") or [16, 112, 112, 3]
    return list(manifest["classes"]), (int(shape[0]), int(shape[1]), int(shape[2]))


def _say(info: dist.DistInfo, text: str) -> None:
    if info.is_main:
        print(text, flush=True)


def save_eval(out: str, name: str, result: dict[str, Any]) -> dict[str, str]:
    """``OUT/eval/NAME.json`` and the confusion matrix beside it as a PNG."""
    folder = os.path.join(out, "eval")
    os.makedirs(folder, exist_ok=True)
    js = os.path.join(folder, f"{name}.json")
    png = os.path.join(folder, f"{name}_confusion.png")
    with open(js, "w") as f:
        json.dump(result, f, indent=1)
    confusion_png(result["confusion"], result["classes"], png, title=f"video-level confusion ({name})")
    return {"json": js, "confusion_png": png}


def build_model(args, classes: list[str], clip_len: int, info: dist.DistInfo) -> C3D:
    """C3D for these classes, maybe with fine-tuning weights, on this rank's device."""
    # Same seed on every rank for the weights (DDP copies rank 0's anyway).
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    model = C3D(len(classes), width=args.model_width, bn=args.bn, clip_len=clip_len,
                crop_size=args.crop_size // args.downsample, dropout=args.dropout)
    if args.finetune and not (args.resume and os.path.exists(ckpt_io.latest_path(args.out))):
        try:
            left = load_for_finetuning(model, ckpt_io.model_state(ckpt_io.load(args.finetune)))
        except ValueError as exc:
            raise TrainError(f"--finetune {args.finetune}: {exc}") from exc
        _say(info, f"fine-tuning from {args.finetune}; newly initialised: {', '.join(left) or 'nothing'}")
    if args.sync_bn and info.distributed and args.bn:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model.to(info.device)
    if args.channels_last:
        model.to(memory_format=torch.channels_last_3d)
    # Per-rank streams from here on, so ranks draw different dropout masks.
    torch.manual_seed(args.seed + 1000 * info.rank)
    random.seed(args.seed + 1000 * info.rank)
    np.random.seed(args.seed + 1000 * info.rank)
    return model


def auto_batch(args, model: nn.Module, clip_len: int, num_classes: int, info: dist.DistInfo) -> dict:
    """Replace ``--batch-size auto`` by the largest batch every rank can hold."""
    crop = args.crop_size // args.downsample
    batch, details = find_batch_size(model, shape=(clip_len, crop, crop), num_classes=num_classes,
                                     device=info.device, amp_dtype=AMP_DTYPES[args.amp],
                                     channels_last=args.channels_last, headroom=args.auto_headroom,
                                     accum_steps=args.accum_steps)
    (batch,) = dist.all_reduce([float(batch)], info.device, op="min")
    args.batch_size = int(batch)
    _say(info, f"--batch-size auto: {args.batch_size} clips per process (micro-batch "
               f"{args.batch_size // args.accum_steps}, peak <= {args.auto_headroom:.0%} of "
               f"{details['total_bytes'] / 2**30:.0f} GiB, amp {args.amp})")
    return details


def resume(path: str, args, parts: dict[str, Any], data, classes: list[str], info: dist.DistInfo
           ) -> tuple[TrainState, dict | None]:
    """Load a checkpoint into model/optimizer/scaler/scheduler; returns the progress and this rank's RNG state."""
    saved = ckpt_io.load(path)
    ckpt_io.check_classes(saved, classes, path)
    for name, obj in parts.items():
        obj.load_state_dict(saved[name])
    state = TrainState(step=saved["step"], epoch=saved["epoch"], epoch_step=saved["epoch_step"])
    data.load_state_dict(saved["sampler"])
    rng = None
    if saved["world_size"] == info.world_size and saved["batch_size"] == args.batch_size:
        rng = saved["rng"][info.rank]
    else:
        _say(info, "note: world size or batch changed since the checkpoint; the data order continues, "
                   "RNG streams restart")
        consumed = saved["epoch_step"] * saved["batch_size"] * saved["world_size"]
        state.epoch_step = consumed // (args.batch_size * info.world_size)
    _say(info, f"resumed from {path} at step {state.step} (epoch {state.epoch}, {state.epoch_step} steps into it)")
    return state, rng


def wrap(model: nn.Module, args, info: dist.DistInfo) -> tuple[nn.Module, DistributedDataParallel | None]:
    """(module to call, DDP wrapper or None): DDP across ranks, then torch.compile if asked."""
    ddp = None
    if info.distributed:
        ddp = DistributedDataParallel(model, device_ids=[info.device.index] if info.device.type == "cuda" else None,
                                      bucket_cap_mb=args.ddp_bucket_mb,
                                      gradient_as_bucket_view=args.grad_as_bucket_view)
        model = ddp
    if args.compile:
        model = torch.compile(model)
    return model, ddp


def run(args) -> dict[str, Any]:
    """Train as the options say; returns a summary (final evaluation, speed, where files went)."""
    info = dist.init_distributed(args.device, args.dist_backend)
    device = info.device
    check_args(args, device)
    root = check_dataset(args.data, "--data")
    if args.val_data:
        check_dataset(args.val_data, "--val-data")
    if args.loader == "dali":
        dali_builder()  # not installed: say so before anything else
    if args.workers is None:
        args.workers = default_workers(info.world_size, args.loader)
    if args.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = not args.deterministic
    os.makedirs(args.out, exist_ok=True)
    if info.is_main:
        ckpt_io.remove_stale_temps(args.out)  # from a save that a kill interrupted
    amp_dtype = AMP_DTYPES[args.amp]
    classes, stored = dataset_info(root)
    clip_len = args.clip_len or stored[0]

    model = build_model(args, classes, clip_len, info)
    auto = auto_batch(args, model, clip_len, len(classes), info) if args.batch_size == "auto" else None
    data = build_train_data(args, info)
    if data.classes != classes:
        raise TrainError("the training loader's classes differ from the manifest's")
    val = build_eval_data(args.val_data, args, info) if args.val_data else None
    if val is not None and val.classes != classes:
        raise TrainError(f"--val-data has classes {val.classes}, --data has {classes}: label numbers would differ")

    global_batch = args.batch_size * info.world_size
    lr = effective_lr(args.lr, global_batch, args.lr_ref_batch, not args.no_lr_scaling)
    optimizer = build_optimizer(model, args.optimizer, lr, args.momentum, args.weight_decay)
    warmup = args.warmup_steps if args.warmup_epochs is None else round(args.warmup_epochs * data.steps_per_epoch)
    scheduler = build_scheduler(optimizer, schedule=args.schedule, steps_per_epoch=data.steps_per_epoch,
                                epochs=args.epochs, warmup_steps=warmup, step_epochs=args.lr_step_epochs,
                                gamma=args.lr_gamma)
    # One code path: a disabled scaler passes scale/step/update straight through.
    scaler = torch.amp.GradScaler(device.type, enabled=args.amp == "fp16", init_scale=args.init_scale,
                                  growth_interval=args.growth_interval)
    parts = {"model": model, "optimizer": optimizer, "scaler": scaler, "scheduler": scheduler}
    latest = ckpt_io.latest_path(args.out)
    state, rng = TrainState(), None
    if args.resume and os.path.exists(latest):
        state, rng = resume(latest, args, parts, data, classes, info)
    elif args.resume:
        _say(info, f"--resume: no checkpoint in {args.out} yet, starting fresh")
    model_without_ddp = model
    model, ddp = wrap(model, args, info)

    log = MetricsLog(args.out, info.is_main, tensorboard=not args.no_tensorboard)
    log.start(state.step if args.resume and os.path.exists(latest) else None)
    profiler = StepProfiler(args.out, args.profile, info.rank, device) if args.profile else None
    cfg = StepConfig(device=device, amp_dtype=amp_dtype, accum_steps=args.accum_steps, profiler=profiler,
                     channels_last=args.channels_last, downsample=args.downsample,
                     colour_perm_seed=args.seed if args.colour_permutation else None,
                     clip_grad_norm=args.clip_grad_norm, max_steps=args.max_steps,
                     ckpt_every=args.ckpt_every, log_every=args.log_every,
                     progress=info.is_main and not args.no_progress and sys.stderr.isatty())

    def save(st: TrainState) -> None:
        # Every rank's RNG goes in, so each rank resumes its own dropout stream.
        rngs = dist.all_gather_object(ckpt_io.rng_state())
        if info.is_main:
            ckpt_io.save_atomic({
                **{name: obj.state_dict() for name, obj in parts.items()},
                "step": st.step, "epoch": st.epoch, "epoch_step": st.epoch_step,
                "sampler": data.state_dict(consumed=st.epoch_step * args.batch_size),
                "rng": rngs, "world_size": info.world_size, "batch_size": args.batch_size, "classes": classes,
                "args": {k: v for k, v in vars(args).items() if isinstance(v, (int, float, str, bool, type(None)))},
            }, latest)

    _say(info, f"C3D width {args.model_width} on {len(classes)} classes | {info.world_size} process(es) on "
               f"{device.type} | batch {args.batch_size}/process (accum {args.accum_steps}), global {global_batch} | "
               f"lr {lr:.3g} ({args.schedule}) | amp {args.amp} | {data.steps_per_epoch} steps/epoch | "
               f"loader {args.loader}")
    if rng is not None:
        ckpt_io.set_rng_state(rng)  # last, after anything that might draw (model init, DDP, compile)
    t_start = time.perf_counter()
    last_eval = None
    while state.epoch < args.epochs and not (args.max_steps and state.step >= args.max_steps):
        data.set_epoch(state.epoch)
        data.set_position(state.epoch_step * args.batch_size)
        if train_one_epoch(model, ddp, nn.CrossEntropyLoss(), optimizer, scheduler, scaler, data, state, cfg, log,
                           save, world_size=info.world_size):
            break  # --max-steps reached; train_one_epoch saved the checkpoint
        state.epoch += 1
        state.epoch_step = 0
        if val is not None and args.eval_every and state.epoch % args.eval_every == 0:
            last_eval = _eval_and_log(model_without_ddp, val, state, args, cfg, log, info, f"epoch{state.epoch:03d}")
        save(state)
    train_s = time.perf_counter() - t_start
    if profiler is not None:
        _say(info, profiler.close())

    summary: dict[str, Any] = {"out": args.out, "checkpoint": latest, "metrics": log.path, "step": state.step,
                               "epoch": state.epoch, "train_seconds": train_s, "batch_size": args.batch_size,
                               "auto_batch": auto}
    if val is not None and (last_eval is None or last_eval[0] != state.step):
        last_eval = _eval_and_log(model_without_ddp, val, state, args, cfg, log, info, "final")
    if last_eval is not None:
        summary["eval"], summary["eval_files"] = last_eval[1], last_eval[2]
    if info.is_main:
        summary.update(_speed(read_metrics(log.path)))
        summary["curves"] = save_figures(args.out, read_metrics(log.path))
        with open(os.path.join(args.out, "summary.json"), "w") as f:
            json.dump({k: v for k, v in summary.items() if k != "eval"}, f, indent=1, default=str)
    log.close()
    dist.barrier()
    return summary


def _speed(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Medians over the logged windows (the first window holds start-up costs)."""
    train_rows = [r for r in rows if r.get("kind") == "train"]
    if not train_rows:
        return {}
    return {"clips_per_s": float(np.median([r["clips_per_s"] for r in train_rows])),
            "data_wait_frac": float(np.median([r["data_wait_frac"] for r in train_rows])),
            "peak_mem_mb": max(r["peak_mem_mb"] for r in train_rows), "final_loss": train_rows[-1]["loss"]}


def _eval_and_log(model: nn.Module, val, state: TrainState, args, cfg: StepConfig, log: MetricsLog,
                  info: dist.DistInfo, name: str) -> tuple[int, dict, dict]:
    result = evaluate(model, val, cfg.device, cfg.amp_dtype, channels_last=cfg.channels_last,
                      downsample=cfg.downsample, progress=cfg.progress)
    files: dict[str, str] = {}
    if info.is_main:
        files = save_eval(args.out, name, result)
        log.log({"kind": "eval", "step": state.step, "epoch": state.epoch,
                 **{k: v for k, v in result.items() if isinstance(v, (int, float)) and v is not None},
                 "file": files["json"]})
        print(f"eval @ step {state.step}: clip top-1 {result['clip_top1']:.3f}, top-5 {result['clip_top5']:.3f}, "
              f"video top-1 {result['video_top1']:.3f} ({result['videos']} videos, {result['clips']} clips)",
              flush=True)
    return state.step, result, files


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status (2 with a one-line message for setup errors)."""
    args = build_parser().parse_args(argv)
    try:
        run_with_threads(args)
    except TrainError as exc:
        print(f"train: error: {exc}", file=sys.stderr)
        return 2
    finally:
        dist.cleanup()
    return 0


def run_with_threads(args) -> dict[str, Any]:
    """``run`` with ``--threads`` applied for its duration (so library callers get their setting back)."""
    before = torch.get_num_threads()
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        return run(args)
    finally:
        torch.set_num_threads(before)


def run_argv(argv: list[str]) -> dict[str, Any]:
    """Parse ``argv`` as the command line would and train; returns ``run``'s summary, raises TrainError."""
    args = build_parser().parse_args(argv)
    try:
        return run_with_threads(args)
    finally:
        dist.cleanup()
