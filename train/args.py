"""Command line of ``python -m train`` (and ``torchrun ... -m train``).

``build_parser`` gives the options as written; ``resolve_config`` turns the
parsed Namespace into the run's frozen ``TrainConfig`` (``train.config``),
filling in what the machine and the data decide and checking every value,
and nothing downstream reads the Namespace.
"""

from __future__ import annotations

import argparse
import dataclasses
import os

from loaders import default_threads
from loaders.sampler import ORDERS

from .config import AMP_DTYPES, BACKENDS, EPOCH_MODES, LOADER_ALIASES, LOADERS, OPTIMIZERS, TrainConfig
from .data import DataShape, check_dataset, dataset_info, train_sampler
from .dist import DistInfo
from .errors import TrainError
from .protocols import PROTOCOLS
from .schedule import SCALINGS, SCHEDULES


def _batch(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected a positive integer or 'auto', got {text!r}") from exc
    if value < 1:
        raise argparse.ArgumentTypeError(f"batch size must be positive, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m train",
        description="Train C3D on converted clip shards. One process: python -m train --data OUT; "
                    "several: torchrun --nproc_per_node N -m train --data OUT. "
                    "`python -m train demo` runs the synthetic end-to-end demo; `python -m train eval --checkpoint "
                    "CKPT --data OUT` evaluates a checkpoint.")
    g = p.add_argument_group("data")
    g.add_argument("--data", metavar="OUT", required=True, help="training conversion (folder with manifest.json)")
    g.add_argument("--val-data", metavar="OUT", help="validation conversion (default: no evaluation)")
    g.add_argument("--loader", default="threads", choices=(*LOADERS, *LOADER_ALIASES),
                   help="reader: threads (default: reader threads in each training process, pinned batch ring), "
                        "processes (DataLoader worker processes; 'lmdb' is its old name) or dali (GPU pipeline; "
                        "needs nvidia-dali). threads and processes read LMDB and TFRecord conversions")
    g.add_argument("--workers", type=int, default=None,
                   help="reader threads (--loader threads; 0 = read in the training thread) or processes per rank "
                        "(default: threads = CPU cores / ranks on this node, at most 16; processes = one fewer, "
                        "at most 8)")
    g.add_argument("--verify-data", action="store_true",
                   help="check every clip's CRC-32 as it is read: a damaged payload stops the run naming its shard "
                        "and clip (without it, a flipped byte is trained on silently). Costs about 1-5%% of the "
                        "loader's speed (README); python -m convert verify DATA checks whole shards once")
    g.add_argument("--crop-size", type=int, default=112, help="square crop fed to the model (default 112)")
    g.add_argument("--clip-len", type=int, default=None, help="frames per clip (default: the stored length)")
    g.add_argument("--downsample", type=int, default=1,
                   help="average-pool the crop spatially by this factor on the device (default 1: off; the "
                        "CPU demo crops 128 and feeds 64x64)")
    g.add_argument("--colour-permutation", action="store_true",
                   help="randomly permute each training clip's RGB channels (keyed by seed, epoch and clip, like "
                        "the crops); for data where colour is a nuisance, such as the synthetic demo")
    g.add_argument("--epoch-mode", default="clips", choices=EPOCH_MODES,
                   help="clips: an epoch is every stored clip once (default); videos: an epoch is every video "
                        "once, with --clips-per-video of its stored clips chosen at random anew each epoch (the "
                        "usual Kinetics regime; --loader threads or processes)")
    g.add_argument("--clips-per-video", type=int, default=1, help="with --epoch-mode videos (default 1)")
    g.add_argument("--order", default="random", choices=ORDERS,
                   help="random: each epoch a fresh random order (default); blocks: for shards larger than the "
                        "page cache, blocks of --order-block clips that lie side by side in the shards, shuffled, "
                        "and the clips of each --order-window blocks shuffled together, so that the kernel's "
                        "read-ahead brings in clips read next (README: Shards larger than memory)")
    g.add_argument("--order-block", type=int, default=64, help="with --order blocks: clips per block (default 64)")
    g.add_argument("--order-window", type=int, default=16,
                   help="with --order blocks: blocks shuffled together (default 16; window x block clips "
                        "should fit in the page cache)")
    g.add_argument("--no-flip", action="store_true", help="no random horizontal flip in training")

    g = p.add_argument_group("model")
    g.add_argument("--model-width", type=float, default=1.0,
                   help="multiplier on conv channels and fc width (default 1.0: the paper's C3D)")
    g.add_argument("--bn", action="store_true", help="BatchNorm3d after every convolution (off in the paper)")
    g.add_argument("--sync-bn", action="store_true", help="with --bn under torchrun: batch statistics over all ranks")
    g.add_argument("--dropout", type=float, default=0.5, help="dropout after fc6 and fc7 (default 0.5)")
    g.add_argument("--finetune", metavar="CKPT",
                   help="start from these weights; the classifier is re-initialised when the class count differs")
    g.add_argument("--compile", action="store_true", help="torch.compile the model (slower start, faster steps)")
    g.add_argument("--channels-last", action="store_true",
                   help="channels_last_3d weights and inputs (CUDA only; usually faster convolutions with AMP)")

    g = p.add_argument_group("optimisation")
    g.add_argument("--epochs", type=int, default=16, help="epochs (default 16, as in the paper); sets the schedule")
    g.add_argument("--max-steps", type=int, default=None,
                   help="stop after this many optimizer steps in total, with a checkpoint (the schedule is "
                        "unchanged, so a resumed run continues exactly)")
    g.add_argument("--batch-size", type=_batch, default=30,
                   help="clips per optimizer step per process (default 30, the paper's batch), split into "
                        "--accum-steps micro-batches; 'auto' = largest that fits on the GPU with headroom")
    g.add_argument("--auto-headroom", type=float, default=0.85,
                   help="with --batch-size auto: fraction of GPU memory a step may peak at (default 0.85)")
    g.add_argument("--eval-protocol", default="clips", choices=PROTOCOLS,
                   help="clips: every stored clip, centre crop (default); 10x3: per video --eval-clips uniformly "
                        "spaced stored clips x 3 crops along the long side, softmax averaged (as papers report)")
    g.add_argument("--eval-clips", type=int, default=10, help="clips per video with --eval-protocol 10x3 (default "
                   "10; all when a video has fewer)")
    g.add_argument("--eval-batch-size", type=int, default=None, help="clips per evaluation batch (default: "
                   "--batch-size)")
    g.add_argument("--accum-steps", type=int, default=1,
                   help="micro-batches per optimizer step; gradients all-reduce on the last one only")
    g.add_argument("--optimizer", default="sgd", choices=OPTIMIZERS, help="default sgd (the paper)")
    g.add_argument("--lr", type=float, default=0.003,
                   help="learning rate for a global batch of --lr-ref-batch clips (default 0.003 per 30 clips, "
                        "the paper's); scaled to batch x processes by --lr-scaling")
    g.add_argument("--lr-ref-batch", type=int, default=30, help="global batch --lr is given for (default 30)")
    g.add_argument("--lr-scaling", default="linear", choices=SCALINGS,
                   help="how --lr follows the global batch: linear (default), sqrt, or none. When the result is "
                        "above --lr and no warm-up is given, a warm-up is added (see --warmup-steps)")
    g.add_argument("--no-lr-scaling", dest="lr_scaling", action="store_const", const="none",
                   help="the same as --lr-scaling none")
    g.add_argument("--max-lr", type=float, default=None, help="cap on the scaled learning rate (default: none)")
    g.add_argument("--momentum", type=float, default=0.9, help="SGD momentum (default 0.9)")
    g.add_argument("--weight-decay", type=float, default=5e-4, help="on weights, not biases (default 5e-4)")
    g.add_argument("--schedule", default="step", choices=SCHEDULES,
                   help="step: x --lr-gamma every --lr-step-epochs (the paper: /10 every 4 epochs); "
                        "cosine: to 0 over --epochs; constant")
    g.add_argument("--lr-step-epochs", type=float, default=4.0, help="step schedule period (default 4 epochs)")
    g.add_argument("--lr-gamma", type=float, default=0.1, help="step schedule factor (default 0.1)")
    warm = g.add_mutually_exclusive_group()
    warm.add_argument("--warmup-steps", type=int, default=None,
                      help="linear warm-up from 0, in optimizer steps (default: none when the lr is --lr; when "
                           "scaling raises it, min(5 epochs, a quarter of --epochs, half of --lr-step-epochs) "
                           "from --lr; 0 turns it off)")
    warm.add_argument("--warmup-epochs", type=float, default=None, help="linear warm-up from 0, in epochs")
    g.add_argument("--label-smoothing", type=float, default=0.0,
                   help="label smoothing of the training loss, as torch's CrossEntropyLoss (default 0: off)")
    g.add_argument("--clip-grad-norm", type=float, default=None, help="clip the gradient norm (default: off)")
    g.add_argument("--amp", default=None, choices=tuple(AMP_DTYPES),
                   help="autocast dtype (default: bf16 on CUDA, off on the CPU). fp16 adds a GradScaler and "
                        "needs CUDA; bf16 also runs on the CPU")
    g.add_argument("--init-scale", type=float, default=2.0**16, help="fp16 GradScaler initial scale (default 65536)")
    g.add_argument("--growth-interval", type=int, default=2000,
                   help="fp16 GradScaler: steps without overflow before the scale doubles (default 2000)")

    g = p.add_argument_group("run")
    g.add_argument("--out", default="runs/c3d",
                   help="folder for checkpoints, metrics.jsonl, eval results and plots (default runs/c3d)")
    g.add_argument("--overwrite", action="store_true",
                   help="train from scratch into an --out that already holds a run (without it, that is refused "
                        "unless --resume)")
    g.add_argument("--resume", action="store_true",
                   help="continue from the newest checkpoint in OUT that loads (same data order, RNG and "
                        "schedule); starts fresh when there is none, so a restart script can always pass it")
    g.add_argument("--seed", type=int, default=0, help="data order, augmentation, init and dropout (default 0)")
    g.add_argument("--device", default="auto", help="auto (cuda:LOCAL_RANK if available, else cpu), cpu or cuda")
    g.add_argument("--dist-backend", default=None, choices=BACKENDS,
                   help="process group backend under torchrun (default nccl on GPUs, gloo on the CPU)")
    g.add_argument("--ddp-bucket-mb", type=float, default=25.0,
                   help="DDP gradient bucket size (default 25, PyTorch's: C3D's ~320 MB of fp32 gradients make "
                        "~13 buckets, whose all-reduces overlap the backward pass; larger buckets mean fewer, "
                        "later launches)")
    g.add_argument("--grad-as-bucket-view", action=argparse.BooleanOptionalAction, default=True,
                   help="gradients are views into DDP's buckets (default on: saves one gradient-sized copy, "
                        "~320 MB for C3D, and a memcpy per step)")
    g.add_argument("--ckpt-every", type=int, default=0,
                   help="also checkpoint every N optimizer steps (default 0: at epoch ends, at --max-steps and on "
                        "SIGTERM/SIGUSR1 only)")
    g.add_argument("--keep-last", type=int, default=3,
                   help="checkpoint_step<N>.pt files kept (default 3); checkpoint.pt is the newest and "
                        "checkpoint_best.pt the best by validation video top-1")
    g.add_argument("--early-stop", type=int, default=None, metavar="PATIENCE",
                   help="stop when validation video top-1 has not improved in PATIENCE evaluations (needs "
                        "--val-data)")
    g.add_argument("--eval-every", type=int, default=1,
                   help="evaluate every N epochs (default 1; 0 = only at the end); needs --val-data")
    g.add_argument("--log-every", type=int, default=10, help="optimizer steps per metrics.jsonl line (default 10)")
    g.add_argument("--no-progress", action="store_true", help="no tqdm progress bar")
    g.add_argument("--no-tensorboard", action="store_true", help="do not write TensorBoard events even if installed")
    g.add_argument("--threads", type=int, default=None,
                   help="CPU threads for this process's math (default: PyTorch's choice; torchrun sets 1 per "
                        "process). One thread is steadier on a busy machine, where OpenMP threads wait on each other")
    g.add_argument("--profile", type=int, default=0, metavar="STEPS",
                   help="record a torch.profiler trace of STEPS training steps (after 2 warm-up steps) in "
                        "OUT/profile/ (TensorBoard's profiler plugin reads it); default 0: off")
    g.add_argument("--deterministic", action="store_true",
                   help="torch.use_deterministic_algorithms (on GPUs slower, needed for bit-exact resume there)")
    return p


def default_workers(loader: str) -> int:
    """``--workers`` when not given: reader threads = this rank's share of the cores (at most 16,
    ``loaders.default_threads``; the ranks on this node, ``LOCAL_WORLD_SIZE``, share them); worker
    processes = one fewer (the training process needs a core of its own), at most 8."""
    threads = default_threads()
    if loader == "threads":
        return threads
    return max(0, min(8, threads - 1))


def resolve_config(args: argparse.Namespace, info: DistInfo, shape: DataShape | None = None) -> TrainConfig:
    """The run's ``TrainConfig`` from ``python -m train``'s parsed options, for this process.

    Fills in the defaults that depend on the machine (``info``: device, world
    size) and on the data (``shape``, read from ``--data`` when not given:
    clip length, clips per rank and epoch), checks the files the options name,
    and, unless ``--batch-size auto``, resolves the batch (``with_batch``).
    """
    device = info.device
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig) if hasattr(args, f.name)}
    loader = LOADER_ALIASES.get(args.loader, args.loader)
    root = check_dataset(args.data, "--data")
    if args.val_data:
        check_dataset(args.val_data, "--val-data")
    if args.finetune and not os.path.isfile(args.finetune):
        raise TrainError(f"--finetune {args.finetune}: no such file")
    shape = shape or dataset_info(root, args.crop_size)
    if args.clip_len is not None and args.clip_len > shape.clip_len:
        raise TrainError(f"--clip-len {args.clip_len} is longer than the stored clips of --data ({shape.clip_len} "
                         f"frames)")
    clip_len = args.clip_len or shape.clip_len
    if args.val_data:
        val_shape = dataset_info(args.val_data, args.crop_size, "--val-data")
        if val_shape.clip_len < clip_len:
            raise TrainError(f"--val-data {args.val_data}: clips of {val_shape.clip_len} frames, the model takes "
                             f"{clip_len}")
    if args.clips_per_video < 1:  # before the sampler below, which would say it less plainly
        raise TrainError(f"--clips-per-video must be an integer >= 1, got {args.clips_per_video}")
    try:
        samples = len(train_sampler(shape.video_clips, epoch_mode=args.epoch_mode,
                                    clips_per_video=args.clips_per_video, world_size=info.world_size, rank=info.rank,
                                    seed=args.seed))
    except ValueError as exc:  # the sampler's own check of a setting (a negative seed...)
        raise TrainError(f"--data {root}: {exc}") from exc
    auto = args.batch_size == "auto"
    given.update(
        loader=loader, clip_len=clip_len, device=str(device), dist_backend=info.backend,
        amp=args.amp or ("off" if device.type != "cuda" else "bf16"),
        workers=default_workers(loader) if args.workers is None else args.workers,
        batch_size=None, auto_batch=auto, world_size=info.world_size, epoch_samples=samples, steps_per_epoch=None,
        lr_plan=None)
    pending = TrainConfig(**given)
    return pending if auto else pending.with_batch(args.batch_size)
