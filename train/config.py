"""A run's settings, resolved once: ``TrainConfig``.

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

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

import torch

from loaders.sampler import ORDERS

from .errors import TrainError
from .protocols import PROTOCOLS
from .schedule import SCALINGS, SCHEDULES, LrPlan, plan_lr

LOADERS = ("threads", "processes", "dali")
LOADER_ALIASES = {"lmdb": "processes"}  # the old name of --loader processes, kept for old commands
AMP_DTYPES: dict[str, torch.dtype | None] = {"bf16": torch.bfloat16, "fp16": torch.float16, "off": None}
EPOCH_MODES = ("clips", "videos")
OPTIMIZERS = ("sgd", "adamw")
BACKENDS = ("nccl", "gloo")

# Allowed values of the settings that take a name (None: the setting may be unset).
_CHOICES: dict[str, tuple] = {"loader": LOADERS, "epoch_mode": EPOCH_MODES, "order": ORDERS, "optimizer": OPTIMIZERS,
                              "lr_scaling": SCALINGS, "schedule": SCHEDULES, "amp": tuple(AMP_DTYPES),
                              "eval_protocol": PROTOCOLS, "dist_backend": (None, *BACKENDS)}
# Smallest allowed value of the integer settings; those in _OPTIONAL may also be None (unset).
_AT_LEAST: dict[str, int] = {"workers": 0, "crop_size": 1, "clip_len": 1, "downsample": 1, "clips_per_video": 1,
                             "epochs": 1, "max_steps": 1, "batch_size": 1, "eval_clips": 1, "eval_batch_size": 1,
                             "accum_steps": 1, "lr_ref_batch": 1, "warmup_steps": 0, "growth_interval": 1,
                             "keep_last": 1, "early_stop": 1, "eval_every": 0, "ckpt_every": 0, "log_every": 1,
                             "threads": 1, "profile": 0, "world_size": 1, "epoch_samples": 0,
                             "steps_per_epoch": 1, "order_block": 1, "order_window": 1}
# Ranges of the real-valued settings: (low, low included, high, high included); None: no bound.
_RANGES: dict[str, tuple[float | None, bool, float | None, bool]] = {
    "model_width": (0.0, False, None, False), "dropout": (0.0, True, 1.0, False),
    "auto_headroom": (0.0, False, 1.0, True), "lr": (0.0, True, None, False), "max_lr": (0.0, False, None, False),
    "momentum": (0.0, True, None, False), "weight_decay": (0.0, True, None, False),
    "lr_step_epochs": (0.0, True, None, False), "lr_gamma": (0.0, True, None, False),
    "warmup_epochs": (0.0, True, None, False), "label_smoothing": (0.0, True, 1.0, False),
    "clip_grad_norm": (0.0, False, None, False), "init_scale": (0.0, False, None, False),
    "ddp_bucket_mb": (0.0, False, None, False)}
_OPTIONAL = {"max_steps", "batch_size", "eval_batch_size", "warmup_steps", "early_stop", "threads",
             "steps_per_epoch", "max_lr", "warmup_epochs", "clip_grad_norm"}


# Settings newer than some checkpoints, with the value that gives what a run before them did.
_ADDED: dict[str, Any] = {"order": "random", "order_block": 64, "order_window": 16}


def flag(name: str) -> str:
    """The command-line option of a setting: ``crop_size`` -> ``--crop-size``."""
    return "--" + name.replace("_", "-")


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Every setting of one training run, as resolved values (see the module docstring).

    The fields are the options of ``python -m train`` under their argparse
    names (``--crop-size`` is ``crop_size``), with the machine's and the data's
    defaults filled in (``device``, ``amp``, ``workers``, ``clip_len``,
    ``dist_backend``; ``loader`` without its old alias), plus what the run
    derives: ``world_size`` (processes), ``epoch_samples`` (clips each rank
    trains on per epoch), ``steps_per_epoch``, ``eval_batch_size`` and
    ``lr_plan`` (peak lr, warm-up, and why). ``auto_batch`` records
    ``--batch-size auto``; until ``with_batch`` gives its answer,
    ``batch_size``, ``steps_per_epoch`` and ``lr_plan`` are None together
    (and ``eval_batch_size`` None unless given).
    """

    # data
    data: str
    val_data: str | None
    loader: str
    workers: int
    verify_data: bool
    crop_size: int
    clip_len: int
    downsample: int
    colour_permutation: bool
    epoch_mode: str
    clips_per_video: int
    order: str
    order_block: int
    order_window: int
    no_flip: bool
    # model
    model_width: float
    bn: bool
    sync_bn: bool
    dropout: float
    finetune: str | None
    compile: bool
    channels_last: bool
    # optimisation
    epochs: int
    max_steps: int | None
    batch_size: int | None
    auto_batch: bool
    auto_headroom: float
    eval_protocol: str
    eval_clips: int
    eval_batch_size: int | None
    accum_steps: int
    optimizer: str
    lr: float
    lr_ref_batch: int
    lr_scaling: str
    max_lr: float | None
    momentum: float
    weight_decay: float
    schedule: str
    lr_step_epochs: float
    lr_gamma: float
    warmup_steps: int | None
    warmup_epochs: float | None
    label_smoothing: float
    clip_grad_norm: float | None
    amp: str
    init_scale: float
    growth_interval: int
    # run
    out: str
    overwrite: bool
    resume: bool
    seed: int
    device: str
    dist_backend: str | None
    ddp_bucket_mb: float
    grad_as_bucket_view: bool
    ckpt_every: int
    keep_last: int
    early_stop: int | None
    eval_every: int
    log_every: int
    no_progress: bool
    no_tensorboard: bool
    threads: int | None
    profile: int
    deterministic: bool
    # derived
    world_size: int
    epoch_samples: int
    steps_per_epoch: int | None
    lr_plan: LrPlan | None

    def __post_init__(self) -> None:
        for name, allowed in _CHOICES.items():
            value = getattr(self, name)
            if value not in allowed:
                shown = ", ".join("unset" if a is None else a for a in allowed)
                raise TrainError(f"{flag(name)} {value!r}: expected one of {shown}")
        for name, low in _AT_LEAST.items():
            value = getattr(self, name)
            if value is None and name in _OPTIONAL:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise TrainError(f"{flag(name)} must be an integer >= {low}, got {value!r}")
        for name, (low, low_in, high, high_in) in _RANGES.items():
            value = getattr(self, name)
            if value is None and name in _OPTIONAL:
                continue
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            ok = ok and (low is None or value > low or (low_in and value == low))
            ok = ok and (high is None or value < high or (high_in and value == high))
            if not ok:
                lo = "" if low is None else ("[" if low_in else "(") + f"{low:g}, "
                hi = "inf)" if high is None else f"{high:g}" + ("]" if high_in else ")")
                raise TrainError(f"{flag(name)} must be in {lo}{hi}, got {value!r}")
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
        if self.crop_size % self.downsample:
            raise TrainError(f"--crop-size {self.crop_size} must be a multiple of --downsample {self.downsample}")
        if self.warmup_steps is not None and self.warmup_epochs is not None:
            raise TrainError("--warmup-steps and --warmup-epochs: give one of them")
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
            if self.steps_per_epoch != self.epoch_samples // self.batch_size:
                raise TrainError(f"steps_per_epoch {self.steps_per_epoch} is not epoch_samples "
                                 f"{self.epoch_samples} // batch_size {self.batch_size}")
            if not isinstance(self.lr_plan, LrPlan):
                raise TrainError(f"lr_plan must be an LrPlan, got {type(self.lr_plan).__name__}")

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
        steps = self.epoch_samples // batch_size
        if steps < 1:
            unit = "clips" if self.epoch_mode == "clips" else f"clips ({self.clips_per_video} per video)"
            raise TrainError(f"--data {self.data}: an epoch gives each of the {self.world_size} process(es) "
                             f"{self.epoch_samples} {unit}, fewer than one batch of {batch_size}")
        plan = plan_lr(base_lr=self.lr, global_batch=batch_size * self.world_size, ref_batch=self.lr_ref_batch,
                       scaling=self.lr_scaling, max_lr=self.max_lr, warmup_steps=self.warmup_steps,
                       warmup_epochs=self.warmup_epochs, steps_per_epoch=steps, epochs=self.epochs,
                       schedule=self.schedule, step_epochs=self.lr_step_epochs)
        return dataclasses.replace(self, batch_size=batch_size, steps_per_epoch=steps, lr_plan=plan,
                                   eval_batch_size=self.eval_batch_size or batch_size)

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
        values = {**_ADDED, **values}
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


__all__ = ["AMP_DTYPES", "BACKENDS", "EPOCH_MODES", "LOADERS", "LOADER_ALIASES", "OPTIMIZERS", "TrainConfig", "flag"]
