"""``main``: build everything, resume if asked, train, evaluate, write results."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import sys
import threading
import time
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from . import checkpoint as ckpt_io
from . import dist
from .args import build_parser, check_args, default_workers
from .autobatch import agree_on_batch, find_batch_size
from .data import build_eval_data, build_train_data, check_dataset, dali_builder, dataset_info
from .engine import BestTracker, StepConfig, StopRequest, TrainState, evaluate, train_one_epoch
from .errors import TrainError
from .gpustats import GpuStats
from .metrics import MetricsLog, read_metrics
from .model import C3D, load_for_finetuning
from .plots import confusion_png, save_figures
from .profiling import StepProfiler
from .schedule import build_optimizer, build_scheduler, plan_lr

AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "off": None}
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


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
        json.dump({k: v for k, v in result.items() if k != "video_scores"}, f, indent=1)
    confusion_png(result["confusion"], result["classes"], png, title=f"video-level confusion ({name})")
    return {"json": js, "confusion_png": png}


def eval_line(result: dict[str, Any]) -> str:
    """The protocol and the accuracies of one evaluation, in one line."""
    return (f"({result['protocol']['name']}: {result['protocol']['text']}): clip top-1 {result['clip_top1']:.3f}, "
            f"top-5 {result['clip_top5']:.3f}, video top-1 {result['video_top1']:.3f}, top-5 "
            f"{result['video_top5']:.3f} ({result['videos']} videos, {result['clips']} views)")


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
    model.to(info.device)
    if args.channels_last:
        model.to(memory_format=torch.channels_last_3d)
    # Per-rank streams from here on, so ranks draw different dropout masks.
    torch.manual_seed(args.seed + 1000 * info.rank)
    random.seed(args.seed + 1000 * info.rank)
    np.random.seed(args.seed + 1000 * info.rank)
    return model


def auto_batch(args, model: nn.Module, clip_len: int, num_classes: int, info: dist.DistInfo) -> dict:
    """Replace ``--batch-size auto`` by the largest batch every rank can hold.

    Each rank probes its own GPU alone (the model is not yet SyncBatchNorm- or
    DDP-wrapped, so no trial step waits on another rank), then one all-reduce
    takes the minimum; a rank whose probe failed sends 0 and all ranks stop.
    """
    crop = args.crop_size // args.downsample
    try:
        local, details = find_batch_size(model, shape=(clip_len, crop, crop), num_classes=num_classes,
                                         device=info.device, amp_dtype=AMP_DTYPES[args.amp],
                                         channels_last=args.channels_last, headroom=args.auto_headroom,
                                         accum_steps=args.accum_steps)
    except TrainError as exc:
        local, details = exc, {}
    args.batch_size = agree_on_batch(local, lambda v: dist.all_reduce([v], info.device, op="min")[0])
    _say(info, f"--batch-size auto: {args.batch_size} clips per process (micro-batch "
               f"{args.batch_size // args.accum_steps}, peak <= {args.auto_headroom:.0%} of "
               f"{details['total_bytes'] / 2**30:.0f} GiB, amp {args.amp})")
    return details


def resume(path: str, saved: dict[str, Any], args, parts: dict[str, Any], data, classes: list[str],
           info: dist.DistInfo) -> tuple[TrainState, dict | None]:
    """Load checkpoint ``saved`` (read from ``path``) into model/optimizer/scaler/scheduler and the sampler.

    Returns the progress and this rank's RNG state (None when the world size or batch changed).
    """
    ckpt_io.check_classes(saved, classes, path)
    ckpt_io.check_settings(saved, args, path)
    for name, obj in parts.items():
        try:
            obj.load_state_dict(saved[name])
        except (KeyError, RuntimeError, ValueError) as exc:  # a setting the checkpoint does not record
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise TrainError(f"checkpoint {path}: its {name} state does not fit this run ({first})") from exc
    state = TrainState(step=saved["step"], epoch=saved["epoch"], epoch_step=saved["epoch_step"],
                       nonfinite=int(saved.get("nonfinite", 0)))
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


@contextlib.contextmanager
def stop_signals(stop: StopRequest):
    """SIGTERM and SIGUSR1 ask the loop to save and stop at the next step boundary (preemption on clusters).

    Installed only in the main thread (where Python delivers signals); the
    previous handlers come back afterwards, for library callers.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, stop.handler) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


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
    held = ckpt_io.describe_run(args.out)
    if held and not args.resume and not args.overwrite:
        raise TrainError(f"--out {args.out} holds a run ({held}): pass --resume to continue it, --overwrite to "
                         f"start it again (its checkpoints and metrics are replaced), or another --out")
    os.makedirs(args.out, exist_ok=True)
    if info.is_main:
        ckpt_io.remove_stale_temps(args.out)  # from a save that a kill interrupted
        if held and args.overwrite and not args.resume:
            ckpt_io.remove_run(args.out)
    dist.barrier()
    amp_dtype = AMP_DTYPES[args.amp]
    shape = dataset_info(root, args.crop_size)
    classes = shape.classes
    if args.clip_len is not None and args.clip_len > shape.clip_len:
        raise TrainError(f"--clip-len {args.clip_len} is longer than the stored clips of --data ({shape.clip_len} "
                         f"frames)")
    clip_len = args.clip_len or shape.clip_len
    if args.val_data:
        val_shape = dataset_info(args.val_data, args.crop_size, "--val-data")
        if val_shape.clip_len < clip_len:
            raise TrainError(f"--val-data {args.val_data}: clips of {val_shape.clip_len} frames, the model takes "
                             f"{clip_len}")

    model = build_model(args, classes, clip_len, info)
    auto = auto_batch(args, model, clip_len, len(classes), info) if args.batch_size == "auto" else None
    if args.sync_bn and info.distributed and args.bn:
        # After the auto-batch probe, which must not run collectives: SyncBatchNorm's forward is one.
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    data = build_train_data(args, info)
    if data.classes != classes:
        raise TrainError("the training loader's classes differ from the manifest's")
    val = build_eval_data(args.val_data, args, info) if args.val_data else None
    if val is not None and val.classes != classes:
        raise TrainError(f"--val-data has classes {val.classes[:5]}{'...' if len(val.classes) > 5 else ''} "
                         f"({len(val.classes)}), --data has {classes[:5]}{'...' if len(classes) > 5 else ''} "
                         f"({len(classes)}): label numbers would differ; {ckpt_io.CLASSES_HINT}")

    global_batch = args.batch_size * info.world_size
    plan = plan_lr(base_lr=args.lr, global_batch=global_batch, ref_batch=args.lr_ref_batch, scaling=args.lr_scaling,
                   max_lr=args.max_lr, warmup_steps=args.warmup_steps, warmup_epochs=args.warmup_epochs,
                   steps_per_epoch=data.steps_per_epoch, epochs=args.epochs, schedule=args.schedule,
                   step_epochs=args.lr_step_epochs)
    lr = plan.lr
    optimizer = build_optimizer(model, args.optimizer, lr, args.momentum, args.weight_decay)
    scheduler = build_scheduler(optimizer, schedule=args.schedule, steps_per_epoch=data.steps_per_epoch,
                                epochs=args.epochs, warmup_steps=plan.warmup_steps, step_epochs=args.lr_step_epochs,
                                gamma=args.lr_gamma, warmup_from=plan.warmup_from)
    # One code path: a disabled scaler passes scale/step/update straight through.
    scaler = torch.amp.GradScaler(device.type, enabled=args.amp == "fp16", init_scale=args.init_scale,
                                  growth_interval=args.growth_interval)
    parts = {"model": model, "optimizer": optimizer, "scaler": scaler, "scheduler": scheduler}
    latest = ckpt_io.latest_path(args.out)
    state, rng = TrainState(), None
    tracker = BestTracker(args.early_stop)
    found = ckpt_io.newest_complete(args.out, lambda text: _say(info, text)) if args.resume else None
    if found is not None:
        state, rng = resume(*found, args, parts, data, classes, info)
        tracker.load_state_dict(found[1].get("best"))
        if state.epoch >= args.epochs or (args.max_steps and state.step >= args.max_steps):
            limit = (f"--max-steps {args.max_steps}" if args.max_steps and state.step >= args.max_steps
                     else f"--epochs {args.epochs}")
            _say(info, f"note: the run in {args.out} already reached {limit} (step {state.step}, epoch "
                       f"{state.epoch}): nothing left to train; raise {limit.split()[0]} to go on")
    elif args.resume:
        _say(info, f"--resume: no checkpoint in {args.out} yet, starting fresh")
    resumed = found is not None
    model_without_ddp = model
    model, ddp = wrap(model, args, info)

    log = MetricsLog(args.out, info.is_main, tensorboard=not args.no_tensorboard)
    log.start(state.step if resumed else None)
    profiler = StepProfiler(args.out, args.profile, info.rank, device) if args.profile else None
    cfg = StepConfig(device=device, amp_dtype=amp_dtype, accum_steps=args.accum_steps, profiler=profiler,
                     channels_last=args.channels_last, downsample=args.downsample,
                     colour_perm_seed=args.seed if args.colour_permutation else None,
                     clip_grad_norm=args.clip_grad_norm, max_steps=args.max_steps,
                     ckpt_every=args.ckpt_every, log_every=args.log_every,
                     progress=info.is_main and not args.no_progress and sys.stderr.isatty(), main=info.is_main,
                     stop=StopRequest(), gpu=GpuStats(device) if info.is_main else None)

    def save(st: TrainState) -> None:
        # Every rank's RNG goes in, so each rank resumes its own dropout stream.
        rngs = dist.all_gather_object(ckpt_io.rng_state())
        if info.is_main:
            ckpt_io.save_checkpoint({
                **{name: obj.state_dict() for name, obj in parts.items()},
                "step": st.step, "epoch": st.epoch, "epoch_step": st.epoch_step, "nonfinite": st.nonfinite,
                "sampler": data.state_dict(consumed=st.epoch_step * args.batch_size), "best": tracker.state_dict(),
                "rng": rngs, "world_size": info.world_size, "batch_size": args.batch_size, "classes": classes,
                "args": {k: v for k, v in vars(args).items() if isinstance(v, (int, float, str, bool, type(None)))},
            }, args.out, st.step, args.keep_last)

    _say(info, f"C3D width {args.model_width} on {len(classes)} classes | {info.world_size} process(es) on "
               f"{device.type} | batch {args.batch_size}/process (accum {args.accum_steps}), global {global_batch} | "
               f"lr {lr:.3g} ({args.schedule}) | amp {args.amp} | {data.steps_per_epoch} steps/epoch | "
               f"loader {args.loader}")
    _say(info, plan.why)
    if rng is not None:
        ckpt_io.set_rng_state(rng)  # last, after anything that might draw (model init, DDP, compile)
    criterion = nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
    t_start = time.perf_counter()
    last_eval = None
    stopped = None
    with stop_signals(cfg.stop):
        while state.epoch < args.epochs and not (args.max_steps and state.step >= args.max_steps):
            data.set_epoch(state.epoch)
            data.set_position(state.epoch_step * args.batch_size)
            stopped = train_one_epoch(model, ddp, criterion, optimizer, scheduler, scaler, data, state, cfg, log,
                                      save, world_size=info.world_size)
            if stopped:
                break  # --max-steps or a signal; train_one_epoch saved the checkpoint
            state.epoch += 1
            state.epoch_step = 0
            improved = False
            if val is not None and args.eval_every and state.epoch % args.eval_every == 0:
                last_eval = _eval_and_log(model_without_ddp, val, state, args, cfg, log, info,
                                          f"epoch{state.epoch:03d}")
                improved = tracker.update(last_eval[1]["video_top1"], state.step)
            save(state)
            if improved and info.is_main:
                ckpt_io.link_atomic(ckpt_io.step_path(args.out, state.step), ckpt_io.best_path(args.out))
            if tracker.exhausted:
                stopped = (f"early stop: validation video top-1 has not improved on {tracker.best:.4f} (step "
                           f"{tracker.best_step}) in {tracker.since} evaluations")
                _say(info, stopped)
                break
    train_s = time.perf_counter() - t_start
    if profiler is not None:
        _say(info, profiler.close())

    summary: dict[str, Any] = {"out": args.out, "is_main": info.is_main, "checkpoint": latest, "metrics": log.path,
                               "step": state.step,
                               "epoch": state.epoch, "train_seconds": train_s, "batch_size": args.batch_size,
                               "nonfinite_steps": state.nonfinite, "stopped": stopped, "auto_batch": auto,
                               "best": tracker.state_dict() | {"checkpoint": ckpt_io.best_path(args.out)}}
    interrupted = bool(stopped and stopped.startswith("signal"))
    if val is not None and not interrupted and (last_eval is None or last_eval[0] != state.step):
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


def print_summary(summary: dict[str, Any], per_class: bool = False) -> None:
    """What a finished run did and where its files are (what ``python -m train`` and the demo print)."""
    print()
    print(f"trained {summary['step']} steps ({summary['epoch']} epochs) in {summary['train_seconds']:.0f} s"
          + (f" ({summary['clips_per_s']:.1f} clips/s" if summary.get("clips_per_s") else "")
          + (f", data wait {summary['data_wait_frac']:.0%}" if summary.get("clips_per_s") else "")
          + (f", GPU busy {summary['gpu_util_pct']:.0f}%" if "gpu_util_pct" in summary else "")
          + (")" if summary.get("clips_per_s") else ""))
    stopped = summary.get("stopped")
    if stopped and stopped.startswith("signal"):
        print(f"stopped by {stopped.split()[1]} at step {summary['step']}: checkpoint saved; run the same command "
              f"with --resume to continue")
    elif stopped and stopped.startswith("early stop"):
        print(f"{stopped}; best checkpoint: {summary['best']['checkpoint']}")
    if summary.get("nonfinite_steps"):
        print(f"non-finite loss in {summary['nonfinite_steps']} step(s) (skipped by the fp16 GradScaler)")
    ev = summary.get("eval")
    if ev is not None:
        print(f"validation: clip top-1 {ev['clip_top1']:.1%}, video top-1 {ev['video_top1']:.1%}, video top-5 "
              f"{ev['video_top5']:.1%} ({ev['videos']} videos, {ev['clips']} clips; chance "
              f"{1 / len(ev['classes']):.1%})")
        if per_class:
            for name, pc in ev["per_class"].items():
                print(f"  {name:12s} video acc {pc['video_acc']:.0%}  clip acc {pc['clip_acc']:.0%}")
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
    util = [r["gpu_util_pct"] for r in train_rows if "gpu_util_pct" in r]
    if util:  # NVML (nvidia-ml-py) was there
        out["gpu_util_pct"] = float(np.median(util))
        out["gpu_mem_used_mb"] = max(r["gpu_mem_used_mb"] for r in train_rows if "gpu_mem_used_mb" in r)
    return out


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
        print(f"eval @ step {state.step} {eval_line(result)}", flush=True)
    return state.step, result, files


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status (2 with a one-line message for setup errors)."""
    args = build_parser().parse_args(argv)
    try:
        summary = run_with_threads(args)
        if summary.get("is_main"):
            print_summary(summary)
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
