"""A run's settings, resolved once: ``TrainConfig``, where every option of ``python -m train`` is declared.

Each field is one setting, declared once with ``convert.format.options.option``: its
type, the command line's default and help, its allowed values and bounds, and
when it was added after the first checkpoints (``added_later``). The parser
of ``python -m train`` (``train.args.build_parser``) and the checks below are
made from these declarations.

``python -m train`` parses its command line, then
``train.args.resolve_config`` turns the Namespace into one frozen ``TrainConfig``: the
defaults that depend on the machine (device, ``--amp``, ``--workers``) and on
the data (clip length, clips per rank and epoch) are filled in, the batch
decides the steps per epoch and the learning-rate plan, and every value is
checked, each problem a one-line ``TrainError`` naming the option. Nothing
changes a config afterwards. The one step that must wait is ``--batch-size
auto``: the probe needs the model, so ``with_batch`` then makes the finished
config (``dataclasses.replace``) with the batch and what follows from it.

The data builders, the loop's ``StepConfig``, the schedule, the checkpoint and
``python -m train eval`` all read this object. A checkpoint stores
``config.to_dict()`` (plain types, so it loads with ``weights_only=True``);
``TrainConfig.from_dict`` gives the same config back, from which a resume
compares the shape-deciding settings and ``python -m train eval`` rebuilds the
model.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from convert.format.options import (
    RESUME_DATA,
    RESUME_FREE,
    RESUME_SHAPE,
    added_later,
    check_settings,
    derived,
    option,
    option_from,
)
from convert.store.cache import CacheSettings
from loaders.dali.sharding import epoch_steps
from loaders.sampler import ORDERS

from .errors import TrainError
from .models import MODELS, model_spec
from .protocols import parse_protocol
from .schedule import SCALINGS, SCHEDULES, LrPlan, plan_lr

LOADERS = ("threads", "processes", "dali")
AMP_DTYPES: dict[str, torch.dtype | None] = {"bf16": torch.bfloat16, "fp16": torch.float16, "off": None}
EPOCH_MODES = ("clips", "videos")
SAMPLINGS = ("clips", "window", "segments")  # loaders.sampling.RULES, as the trainer names them
OPTIMIZERS = ("sgd", "adamw")
DIST_BACKENDS = ("nccl", "gloo")

# The argument groups of python -m train --help.
DATA, MODEL, OPTIM, RUN = "data", "model", "optimisation", "run"
# How --resume compares a setting with the checkpoint's (convert.format.options.RESUME_RULES), by short names: SHAPE
# decides the weights' shapes, ORDER which clips an epoch holds in which order, FREE is not compared.
SHAPE, ORDER, FREE = RESUME_SHAPE, RESUME_DATA, RESUME_FREE


def _numbers(text: str, kind: type[float] | type[int]) -> tuple:
    """The comma-separated numbers of an option's text (``1,0.875``, ``256,320``); () when one is not a number of
    ``kind``: the option's own check then says what it expects."""
    try:
        return tuple(kind(part) for part in text.split(","))
    except ValueError:
        return ()


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Every setting of one training run, as resolved values (see the module docstring).

    The fields are the options of ``python -m train`` under their argparse
    names (``--crop-size`` is ``crop_size``), with the machine's and the data's
    defaults filled in (``device``, ``amp``, ``workers``, ``clip_len``,
    ``dist_backend``; ``crop_size`` and
    ``dropout``, when not given, the ``--model``'s, which the config fills in
    itself), plus what the run
    derives: ``world_size`` (processes), ``epoch_samples`` (clips each rank
    trains on per epoch), ``pad_last_batch`` (the loader pads an epoch's last
    batch rather than dropping it), ``steps_per_epoch``, ``eval_batch_size``
    and ``lr_plan`` (peak lr, warm-up, and why). ``auto_batch`` records
    ``--batch-size auto``; until ``with_batch`` gives its answer,
    ``batch_size``, ``steps_per_epoch`` and ``lr_plan`` are None together
    (and ``eval_batch_size`` None unless given).
    """

    # -- data -------------------------------------------------------------------
    # on_resume: SHAPE and ORDER settings must match the checkpoint's, FREE ones are not compared, the others
    # are printed when they changed (convert.format.options.RESUME_RULES).
    data: str = option(DATA, "training conversion: a folder with manifest.json, or its URL (s3://, gs://, "
                             "http(s)://, file://...; read through a local cache: --cache-dir)", metavar="OUT",
                       required=True)
    val_data: str | None = option(DATA, "validation conversion, folder or URL (default: no evaluation)", metavar="OUT")
    # A URL's conversion is the same data in another place: where it is cached never changes a batch.
    # Declared once, on the shard cache's settings (every command reading a URL takes them); the trainer adds
    # where its own prefetch sets the floor.
    cache_dir: str | None = option_from(CacheSettings, "cache_dir", group=DATA, more="shared by the ranks of a node",
                                        added_later=None, on_resume=FREE)
    cache_limit: int | None = option_from(
        CacheSettings, "limit", group=DATA,
        more=f"refused when smaller than the largest shard times 1 + the prefetch ({CacheSettings.prefetch} shards; "
             "with --order shards, --order-shards if more); --order shards downloads each shard once per epoch "
             "from 2 x --order-shards shards", added_later=None, on_resume=FREE)
    loader: str = option(
        DATA, "reader: threads (reader threads in each training process, pinned batch ring), "
              "processes (DataLoader worker processes) or dali (GPU pipeline; "
              "needs nvidia-dali). threads and processes read LMDB and TFRecord conversions",
        default="threads", choices=LOADERS)
    workers: int = option(
        DATA, "reader threads (--loader threads; 0 = read in the training thread) or processes per rank "
              "(default: threads = CPU cores / ranks on this node, at most 16; processes = one fewer, "
              "at most 8)", ge=0, on_resume=FREE)
    verify_data: bool = option(
        DATA, "check every clip's CRC-32 as it is read: a damaged payload stops the run naming its shard "
              "and clip (without it, a flipped byte is trained on silently). Costs a few per cent of the "
              "loader's speed (docs/benchmarks.md); python -m convert verify DATA checks whole shards once",
        default=False, on_resume=FREE)
    crop_size: int = option(DATA, "square crop fed to the model (default: the model's, 112; 224 for i3d_r50)", ge=1,
                            on_resume=SHAPE)
    clip_len: int = option(DATA, "frames per clip (default: the stored length)", ge=1, on_resume=SHAPE)
    downsample: int = option(
        DATA, "average-pool the crop spatially by this factor on the device (1: off; the "
              "CPU demo crops 128 and feeds 64x64)", default=1, ge=1, on_resume=SHAPE)
    colour_permutation: bool = option(
        DATA, "randomly permute each training clip's RGB channels (keyed by seed, epoch and clip, like "
              "the crops); for data where colour is a nuisance, such as the synthetic demo", default=False)
    epoch_mode: str = option(
        DATA, "clips: an epoch is every stored clip once; videos: an epoch is every video "
              "once, with --clips-per-video of its stored clips chosen at random anew each epoch (the "
              "usual Kinetics regime; --loader threads or processes)", default="clips", choices=EPOCH_MODES,
        on_resume=ORDER)
    clips_per_video: int = option(DATA, "with --epoch-mode videos: stored clips of each video per epoch; with "
                                        "--sampling window or segments: samples of each video per epoch",
                                  default=1, ge=1, on_resume=ORDER)
    sampling: str = option(
        DATA, "which frames a sample is (loaders.sampling.SampleSpec; default: the --model's recipe, "
              "ModelSpec.sampling: clips for every network in the registry now). clips: each stored clip, as "
              "converted; "
              "window: --clip-len frames at --frame-step from anywhere in each video (evaluation: --eval-clips "
              "windows spread evenly with --eval-protocol 10x3, else the centre one); segments (TSN): each video "
              "cut into --clip-len segments, one frame of each. window and segments read a conversion whose "
              "clips tile its videos (--stride 1, no --step) at any length and step",
        choices=SAMPLINGS, on_resume=ORDER, added_later="clips")
    frame_step: int = option(DATA, "with --sampling window: frames between a sample's frames (default: the "
                                   "--model's recipe's, 1 for every network in the registry now)", ge=1,
                             on_resume=ORDER, added_later=1)
    order: str = option(
        DATA, "random: each epoch a fresh random order; blocks: for shards larger than the "
              "page cache, blocks of --order-block clips that lie side by side in the shards, shuffled, "
              "and the clips of each --order-window blocks shuffled together, so that the kernel's "
              "read-ahead brings in clips read next (docs/reading.md: shards larger than memory); shards: "
              "the shards shuffled and read --order-shards at a time, the clips of those shards shuffled "
              "together, so that a bounded cache of whole shards fetches each shard once per epoch",
        default="random", choices=ORDERS, added_later="random", on_resume=ORDER)
    order_block: int = option(DATA, "with --order blocks: clips per block", default=64, ge=1,
                              added_later=64, on_resume=ORDER)
    order_window: int = option(
        DATA, "with --order blocks: blocks shuffled together (window x block clips "
              "should fit in the page cache)", default=16, ge=1, added_later=16, on_resume=ORDER)
    order_shards: int = option(
        DATA, "with --order shards: shards read at a time (that many whole shards, and the next "
              "window's, should fit in the shard cache)", default=4, ge=1, added_later=4, on_resume=ORDER)
    no_flip: bool = option(DATA, "no random horizontal flip in training", default=False)
    crop_scales: str | None = option(
        DATA, "training crops of several scales, as mmaction2's MultiScaleCrop: a square of one of these fractions "
              "of the frame's short side (drawn per clip, e.g. 1,0.875,0.75,0.66), at a random place, resized to "
              "--crop-size (default: a --crop-size square cut as it is)", metavar="S,S,...", added_later=None)
    short_side_scale: str | None = option(
        DATA, "crops of frames as if resized to a short side of LO..HI pixels first (drawn per sample in "
              "training; LO in evaluation), as PySlowFast's and PyTorchVideo's short-side scale: a square of "
              "--crop-size * short / S of the stored frame, resized to --crop-size with a filtered downscale; "
              "e.g. 256,320 from a --short-side 320 conversion (default: crops cut as they are stored)",
        metavar="LO[,HI]", added_later=None)
    random_resized_crop: str | None = option(
        DATA, "training crops as Inception's random-resized crop (torchvision's and mmaction2's "
              "RandomResizedCrop, MViT's and VideoMAE's recipes): a region of LO..HI of the frame's area at an "
              "aspect ratio of 3/4..4/3, resized to --crop-size (evaluation: the centre --crop-size square); "
              "e.g. 0.08,1", metavar="LO,HI", added_later=None)
    # -- model ------------------------------------------------------------------
    # Checkpoints written before the registry are C3D's.
    model: str = option(
        MODEL, "the network, from the registry (train.models.MODELS): " +
               "; ".join(f"{name}, {spec.title} ({spec.summary.split(':')[0]})" for name, spec in MODELS.items()) +
               "; --inflate-from takes ImageNet ResNet-50 weights for " +
               ", ".join(name for name, spec in MODELS.items() if spec.inflatable),
        default="c3d", choices=tuple(MODELS), added_later="c3d", on_resume=SHAPE)
    model_width: float = option(
        MODEL, "multiplier on every channel count (and C3D's fc width); 1 is the published network",
        default=1.0, gt=0.0, on_resume=SHAPE)
    bn: bool = option(MODEL, "c3d: BatchNorm3d after every convolution (off in the paper; the other models have it "
                             "always)", default=False, on_resume=SHAPE)
    sync_bn: bool = option(MODEL, "under torchrun, BatchNorm's batch statistics over all ranks (a model with "
                                  "BatchNorm: --bn, or any but c3d)", default=False)
    dropout: float = option(MODEL, "dropout before the classifier (c3d: after fc6 and fc7); default: the model's, "
                                   "0.5 for c3d and i3d_r50, 0 for the ResNets", ge=0.0, lt=1.0)
    finetune: str | None = option(
        MODEL, "start from these weights; the classifier is re-initialised when the class count differs",
        metavar="CKPT", exclusive="init", on_resume=FREE)
    inflate_from: str | None = option(
        MODEL, "i3d_r50: start from a 2-D ResNet-50 state dict (torchvision's names, e.g. its ImageNet weights), "
               "each kernel repeated over time / depth, BatchNorm copied; the classifier stays new",
        metavar="PATH", exclusive="init", added_later=None, on_resume=FREE)
    compile: bool = option(MODEL, "torch.compile the model (slower start, faster steps)", default=False)
    channels_last: bool = option(
        MODEL, "channels_last_3d weights and inputs (CUDA only; usually faster convolutions with AMP)", default=False)
    # -- optimisation -----------------------------------------------------------
    epochs: int = option(OPTIM, "epochs (the paper's by default); sets the schedule", default=16, ge=1)
    max_steps: int | None = option(
        OPTIM, "stop after this many optimizer steps in total, with a checkpoint (the schedule is "
               "unchanged, so a resumed run continues exactly)", ge=1, on_resume=FREE)
    batch_size: int | None = option(
        OPTIM, "clips per optimizer step per process (by default the paper's batch), split into "
               "--accum-steps micro-batches; 'auto' = largest that fits on the GPU with headroom",
        default=30, ge=1, words=("auto",))
    auto_batch: bool = derived()
    auto_headroom: float = option(
        OPTIM, "with --batch-size auto: fraction of GPU memory a step may peak at",
        default=0.85, gt=0.0, le=1.0, on_resume=FREE)
    eval_protocol: str = option(
        OPTIM, "clips: every stored clip, centre crop; NxM (10x3, 4x3, 5x3, 2x3, 8x1...): per video N "
               "uniformly spaced stored clips (with --sampling window or segments: N samples spread evenly) x M "
               "crops, 1 centred or 3 along the long side, softmax averaged (as papers report); 10x3 takes N "
               "from --eval-clips", default="clips", parse=parse_protocol, metavar="clips|NxM")
    eval_clips: int = option(OPTIM, "clips per video with --eval-protocol 10x3 (all when a video has "
                                    "fewer)", default=10, ge=1)
    eval_batch_size: int | None = option(OPTIM, "clips per evaluation batch (default: --batch-size)", ge=1,
                                         on_resume=FREE)
    accum_steps: int = option(
        OPTIM, "micro-batches per optimizer step; gradients all-reduce on the last one only", default=1, ge=1)
    optimizer: str = option(OPTIM, "the optimizer (the paper: sgd)", default="sgd", choices=OPTIMIZERS, on_resume=SHAPE)
    lr: float = option(
        OPTIM, "learning rate for a global batch of --lr-ref-batch clips (by default the paper's, per 30 "
               "clips); scaled to batch x processes by --lr-scaling", default=0.003, ge=0.0)
    lr_ref_batch: int = option(OPTIM, "global batch --lr is given for", default=30, ge=1)
    lr_scaling: str = option(
        OPTIM, "how --lr follows the global batch: linear, sqrt, or none. When the result is "
               "above --lr and no warm-up is given, a warm-up is added (see --warmup-steps)",
        default="linear", choices=SCALINGS, also=[("--no-lr-scaling", "none", "the same as --lr-scaling none")])
    max_lr: float | None = option(OPTIM, "cap on the scaled learning rate (default: none)", gt=0.0)
    momentum: float = option(OPTIM, "SGD momentum", default=0.9, ge=0.0)
    weight_decay: float = option(OPTIM, "weight decay, on weights, not biases", default=5e-4, ge=0.0)
    schedule: str = option(
        OPTIM, "step: x --lr-gamma every --lr-step-epochs (the paper: /10 every 4 epochs); "
               "cosine: to 0 over --epochs; constant", default="step", choices=SCHEDULES)
    lr_step_epochs: float = option(OPTIM, "step schedule period, in epochs", default=4.0, ge=0.0)
    lr_gamma: float = option(OPTIM, "step schedule factor", default=0.1, ge=0.0)
    warmup_steps: int | None = option(
        OPTIM, "linear warm-up from 0, in optimizer steps (default: none when the lr is --lr; when "
               "scaling raises it, min(5 epochs, a quarter of --epochs, half of --lr-step-epochs) "
               "from --lr; 0 turns it off)", ge=0, exclusive="warmup")
    warmup_epochs: float | None = option(OPTIM, "linear warm-up from 0, in epochs", ge=0.0, exclusive="warmup")
    label_smoothing: float = option(
        OPTIM, "label smoothing of the training loss, as torch's CrossEntropyLoss (0: off)",
        default=0.0, ge=0.0, lt=1.0)
    clip_grad_norm: float | None = option(OPTIM, "clip the gradient norm (default: off)", gt=0.0)
    amp: str = option(
        OPTIM, "autocast dtype (default: bf16 on CUDA, off on the CPU). fp16 adds a GradScaler and "
               "needs CUDA; bf16 also runs on the CPU", choices=tuple(AMP_DTYPES))
    init_scale: float = option(OPTIM, "fp16 GradScaler initial scale", default=2.0**16, gt=0.0)
    growth_interval: int = option(
        OPTIM, "fp16 GradScaler: steps without overflow before the scale doubles",
        default=2000, ge=1)
    # -- run --------------------------------------------------------------------
    out: str = option(RUN, "folder for checkpoints, metrics.jsonl, eval results and plots",
                      default="runs/c3d", on_resume=FREE)
    overwrite: bool = option(
        RUN, "train from scratch into an --out that already holds a run (without it, that is refused "
             "unless --resume)", default=False, on_resume=FREE)
    resume: bool = option(
        RUN, "continue from the newest checkpoint in OUT that loads (same data order, RNG and "
             "schedule); starts fresh when there is none, so a restart script can always pass it. Settings "
             "that decide the weights' shapes or the data must be the checkpoint's; others that changed are "
             "printed", default=False, on_resume=FREE)
    force_resume: bool = option(
        RUN, "with --resume: continue although --data is not the conversion the checkpoint was trained on, or "
             "--seed, --epoch-mode, --clips-per-video or --order* differ from its (the epoch in progress goes "
             "on at its position in the new order)", default=False, added_later=False, on_resume=FREE)
    seed: int = option(RUN, "seed of the data order, augmentation, init and dropout", default=0, ge=0,
                       on_resume=ORDER)
    device: str = option(RUN, "auto (cuda:LOCAL_RANK if available, else cpu), cpu or cuda", default="auto")
    dist_backend: str | None = option(
        RUN, "process group backend under torchrun (default nccl on GPUs, gloo on the CPU)", choices=DIST_BACKENDS,
        on_resume=FREE)
    ddp_bucket_mb: float = option(
        RUN, "DDP gradient bucket size in MB (the default is PyTorch's: C3D's ~320 MB of fp32 gradients make "
             "~13 buckets, whose all-reduces overlap the backward pass; larger buckets mean fewer, "
             "later launches)", default=25.0, gt=0.0, on_resume=FREE)
    grad_as_bucket_view: bool = option(
        RUN, "gradients are views into DDP's buckets (default on: saves one gradient-sized copy, "
             "~320 MB for C3D, and a memcpy per step)", default=True, on_resume=FREE)
    ckpt_every: int = option(
        RUN, "also checkpoint every N optimizer steps (0: at epoch ends, at --max-steps and on "
             "SIGTERM/SIGINT/SIGHUP/SIGUSR1 only)", default=0, ge=0, on_resume=FREE)
    keep_last: int = option(
        RUN, "checkpoint_step<N>.pt files kept; checkpoint.pt is the newest and "
             "checkpoint_best.pt the best by validation video top-1", default=3, ge=1, on_resume=FREE)
    early_stop: int | None = option(
        RUN, "stop when validation video top-1 has not improved in PATIENCE evaluations (needs "
             "--val-data)", ge=1, metavar="PATIENCE")
    eval_every: int = option(RUN, "evaluate every N epochs (0 = only at the end); needs --val-data",
                             default=1, ge=0)
    log_every: int = option(RUN, "optimizer steps per metrics.jsonl line", default=10, ge=1,
                            on_resume=FREE)
    no_progress: bool = option(RUN, "no tqdm progress bar on a terminal, no progress line every minute elsewhere",
                               default=False, on_resume=FREE)
    no_tensorboard: bool = option(RUN, "do not write TensorBoard events even if installed", default=False,
                                  on_resume=FREE)
    threads: int | None = option(
        RUN, "CPU threads for this process's math (default: PyTorch's choice; torchrun sets 1 per "
             "process). One thread is steadier on a busy machine, where OpenMP threads wait on each other", ge=1,
        on_resume=FREE)
    profile: int = option(
        RUN, "record a torch.profiler trace of STEPS training steps (after 2 warm-up steps) in "
             "OUT/profile/ (TensorBoard's profiler plugin reads it); 0: off",
        default=0, ge=0, metavar="STEPS", on_resume=FREE)
    deterministic: bool = option(
        RUN, "torch.use_deterministic_algorithms (on GPUs slower, needed for bit-exact resume there)", default=False,
        on_resume=FREE)
    # -- derived by the run -----------------------------------------------------
    world_size: int = derived(ge=1)
    epoch_samples: int = derived(ge=0)
    steps_per_epoch: int | None = derived(ge=1)
    # The training loader pads each rank's last batch of an epoch instead of dropping it (DALI's native
    # TFRecord reader, pad_last_batch); epoch_samples is then its largest shard.
    pad_last_batch: bool = derived(added_later=False)
    lr_plan: LrPlan | None = derived()  # noqa: RUF009 - a declaration (convert.format.options), not a shared default

    def __post_init__(self) -> None:
        self._model_defaults()
        check_settings(self, TrainError)  # each field as declared above, and the exclusive options
        self._check_combinations()

    def _check_combinations(self) -> None:
        try:
            device = torch.device(self.device)
        except RuntimeError as exc:
            raise TrainError(f"--device {self.device!r}: expected cpu, cuda or cuda:N") from exc
        if device.type not in ("cpu", "cuda"):
            raise TrainError(f"--device {self.device!r}: expected cpu, cuda or cuda:N")
        cpu = device.type != "cuda"
        if cpu and self.amp == "fp16":
            raise TrainError("--amp fp16 needs CUDA (fp16 autocast with a GradScaler); on the CPU use --amp bf16 "
                             "or off")
        if cpu and self.channels_last:
            raise TrainError("--channels-last needs CUDA (channels_last_3d convolutions are a GPU speed-up)")
        if self.order != "random" and self.loader == "dali":
            raise TrainError(f"--order {self.order} needs --loader threads or processes (DALI's reader keeps its "
                             f"own order: files read in turn through a shuffle buffer)")
        if self.sampling != "clips":
            if self.epoch_mode != "clips":
                raise TrainError(f"--sampling {self.sampling} draws --clips-per-video samples of each video per "
                                 f"epoch itself: it takes --epoch-mode clips")
            if self.order != "random":
                raise TrainError(f"--order {self.order} reads stored clips in the order they lie; --sampling "
                                 f"{self.sampling} reads samples of videos: use --order random")
        if self.frame_step != 1 and self.sampling != "window":
            raise TrainError(f"--frame-step {self.frame_step} is for --sampling window (the stored clips' frames, "
                             f"or one a segment, are read at step 1)")
        if self.crop_size % self.downsample:
            raise TrainError(f"--crop-size {self.crop_size} must be a multiple of --downsample {self.downsample}")
        self._check_model()
        self.scales()  # --crop-scales parses
        try:
            parse_protocol(self.eval_protocol)  # a settings object built without the command line is checked too
        except argparse.ArgumentTypeError as exc:
            raise TrainError(str(exc)) from None
        given = [flag for flag, value in (("--crop-scales", self.crop_scales),
                                          ("--short-side-scale", self.short_side_bounds()),
                                          ("--random-resized-crop", self.resized_areas())) if value is not None]
        if len(given) > 1:
            raise TrainError(f"{' and '.join(given)} are ways to scale the crop: give one")
        if self.early_stop is not None and (not self.val_data or not self.eval_every):
            raise TrainError("--early-stop PATIENCE needs PATIENCE >= 1, --val-data and --eval-every >= 1")
        resolved = [self.batch_size, self.steps_per_epoch, self.lr_plan]
        if any(v is None for v in resolved) and any(v is not None for v in resolved):
            raise TrainError("batch_size, steps_per_epoch and lr_plan are set together (by with_batch) or not at all")
        if self.batch_size is not None and self.eval_batch_size is None:
            raise TrainError("eval_batch_size is set (to the batch when not given) once the batch is")
        if self.batch_size is not None:
            if self.batch_size % self.accum_steps:
                raise TrainError(f"--batch-size {self.batch_size} is not divisible by --accum-steps "
                                 f"{self.accum_steps} (--batch-size is the per-process batch of one optimizer "
                                 f"step, split into equal micro-batches)")
            if self.steps_per_epoch != self.epoch_steps(self.batch_size):
                how = "padded to whole batches of" if self.pad_last_batch else "//"
                raise TrainError(f"steps_per_epoch {self.steps_per_epoch} is not epoch_samples "
                                 f"{self.epoch_samples} {how} batch_size {self.batch_size}")
            if not isinstance(self.lr_plan, LrPlan):
                raise TrainError(f"lr_plan must be an LrPlan, got {type(self.lr_plan).__name__}")

    def scales(self) -> tuple[float, ...] | None:
        """``--crop-scales`` as numbers (None when not given); a one-line TrainError when it does not parse."""
        if self.crop_scales is None:
            return None
        scales = _numbers(self.crop_scales, float)
        if not scales or not all(0.0 < s <= 1.0 for s in scales):
            raise TrainError(f"--crop-scales {self.crop_scales}: expected fractions of the short side in (0, 1], "
                             f"comma-separated, e.g. 1,0.875,0.75,0.66")
        return scales

    def short_side_bounds(self) -> tuple[int, int] | None:
        """``--short-side-scale`` as (lo, hi) (None when not given); a one-line TrainError when it does not parse
        or is smaller than the crop."""
        if self.short_side_scale is None:
            return None
        parts = _numbers(self.short_side_scale, int)
        bounds = (parts[0], parts[-1]) if len(parts) in (1, 2) else (0, 0)
        if not (self.crop_size or 1) <= bounds[0] <= bounds[1]:
            raise TrainError(f"--short-side-scale {self.short_side_scale}: expected LO or LO,HI, whole pixels with "
                             f"--crop-size {self.crop_size} <= LO <= HI")
        return bounds

    def resized_areas(self) -> tuple[float, float] | None:
        """``--random-resized-crop`` as (lo, hi) (None when not given); a one-line TrainError when it does not
        parse."""
        if self.random_resized_crop is None:
            return None
        parts = _numbers(self.random_resized_crop, float)
        if len(parts) != 2 or not 0.0 < parts[0] <= parts[1] <= 1.0:
            raise TrainError(f"--random-resized-crop {self.random_resized_crop}: expected LO,HI, fractions of the "
                             f"frame's area with 0 < LO <= HI <= 1, e.g. 0.08,1")
        return parts[0], parts[1]

    def _model_defaults(self) -> None:
        # --crop-size and --dropout not given (None) are the --model's: they depend on no machine or data, so the
        # config itself fills them in (an unknown --model is left to check_settings to name).
        spec = MODELS.get(self.model)
        if spec is not None and self.crop_size is None:
            object.__setattr__(self, "crop_size", spec.crop_size)
        if spec is not None and self.dropout is None:
            object.__setattr__(self, "dropout", spec.dropout)
        if spec is not None and self.sampling is None:
            object.__setattr__(self, "sampling", spec.sampling.rule)
        if spec is not None and self.frame_step is None:
            # The recipe's step goes with its rule: another --sampling given reads at step 1 unless told.
            object.__setattr__(self, "frame_step", spec.sampling.step if self.sampling == spec.sampling.rule else 1)

    def _check_model(self) -> None:
        spec = model_spec(self.model)  # a known name: check_settings has checked the choice
        if self.bn and "bn" not in spec.options:
            raise TrainError(f"--bn: {self.model} has BatchNorm after every convolution already (--bn adds it to c3d)")
        if self.inflate_from is not None and not spec.inflatable:
            inflatable = ", ".join(name for name, s in MODELS.items() if s.inflatable)
            raise TrainError(f"--inflate-from: {self.model} is not inflated from 2-D weights ({inflatable} is)")

    # -- the late step ----------------------------------------------------------
    def with_batch(self, batch_size: int) -> TrainConfig:
        """The finished config for ``batch_size`` clips per process and step: steps per epoch, LR plan, eval batch.

        Called once, by ``resolve_config`` for a given batch or after the
        ``--batch-size auto`` probe; raises on a config that has its batch already.
        """
        if self.batch_size is not None:
            raise TrainError(f"the batch is resolved already ({self.batch_size}); with_batch is the one late step")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise TrainError(f"--batch-size must be an integer >= 1, got {batch_size!r}")
        steps = self.epoch_steps(batch_size)
        if steps < 1:
            unit = "clips" if self.epoch_mode == "clips" and self.sampling == "clips" else \
                f"samples ({self.clips_per_video} per video)"
            raise TrainError(f"--data {self.data}: an epoch gives each of the {self.world_size} process(es) "
                             f"{self.epoch_samples} {unit}, fewer than one batch of {batch_size}")
        plan = plan_lr(base_lr=self.lr, global_batch=batch_size * self.world_size, ref_batch=self.lr_ref_batch,
                       scaling=self.lr_scaling, max_lr=self.max_lr, warmup_steps=self.warmup_steps,
                       warmup_epochs=self.warmup_epochs, steps_per_epoch=steps, epochs=self.epochs,
                       schedule=self.schedule, step_epochs=self.lr_step_epochs)
        return dataclasses.replace(self, batch_size=batch_size, steps_per_epoch=steps, lr_plan=plan,
                                   eval_batch_size=self.eval_batch_size or batch_size)

    def epoch_steps(self, batch_size: int) -> int:
        """Optimizer steps of an epoch at ``batch_size``: the count the training loaders give too
        (``loaders.dali.sharding.epoch_steps``, the partial last batch dropped or, ``pad_last_batch``, padded)."""
        return epoch_steps(self.epoch_samples, batch_size, pad_last_batch=self.pad_last_batch)

    # -- derived views ----------------------------------------------------------
    @property
    def amp_dtype(self) -> torch.dtype | None:
        """The autocast dtype of ``amp`` (None: no autocast)."""
        return AMP_DTYPES[self.amp]

    @property
    def global_batch(self) -> int:
        """Clips per optimizer step over all processes (needs the batch resolved)."""
        if self.batch_size is None:
            raise TrainError("--batch-size auto is not resolved yet (with_batch)")
        return self.batch_size * self.world_size

    @property
    def model_crop(self) -> int:
        """The side of the model's input: the crop after ``downsample``."""
        return self.crop_size // self.downsample

    # -- the checkpoint's copy --------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Plain str/int/float/bool/None values (``lr_plan`` a dict of them): what a checkpoint stores."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> TrainConfig:
        """The config ``to_dict`` gave (validated again); one-line TrainError when it is not one."""
        if not isinstance(values, Mapping):
            raise TrainError(f"a config must be a dict, got {type(values).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        # Settings added since the first checkpoints, at the values that reproduce what those runs did.
        values = {**added_later(cls), **values}
        missing, unknown = sorted(names - set(values)), sorted(set(values) - names)
        if missing or unknown:
            raise TrainError("config " + "; ".join(
                part for part in (f"lacks {', '.join(missing)}" if missing else "",
                                  f"has unknown settings {', '.join(unknown)}" if unknown else "") if part)
                + " (written by another version of the trainer?)")
        kw = dict(values)
        if kw["lr_plan"] is not None:
            try:
                kw["lr_plan"] = LrPlan(**kw["lr_plan"])
            except TypeError as exc:
                raise TrainError(f"config's lr_plan is not one: {exc}") from exc
        return cls(**kw)


__all__ = ["AMP_DTYPES", "DIST_BACKENDS", "EPOCH_MODES", "LOADERS", "OPTIMIZERS", "SAMPLINGS", "TrainConfig"]
