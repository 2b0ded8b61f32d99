"""Command line of ``python -m train`` (and ``torchrun ... -m train``).

``build_parser`` makes the options from their declarations on ``TrainConfig``
(``train.config``, through ``convert.format.options``), checking numbers as they are
parsed; ``resolve_config`` turns the parsed Namespace into the run's frozen
``TrainConfig``, filling in what the machine and the data decide and checking
every value, and nothing downstream reads the Namespace.
"""

from __future__ import annotations

import argparse
import dataclasses
import os

from convert.format.options import OneLineParser, add_options, settings
from loaders import default_threads

from .config import TrainConfig
from .data import DataShape, cache_settings, check_dataset, dali_route, dataset_info, epoch_share
from .dist import DistInfo
from .errors import TrainError
from .models import model_spec


def build_parser() -> argparse.ArgumentParser:
    """``python -m train``'s parser: every option declared on ``TrainConfig``; a usage error is one TrainError."""
    p = OneLineParser(
        raise_as=TrainError,
        prog="python -m train",
        description="Train a video network (--model: C3D by default) on converted clip shards. One process: "
                    "python -m train --data OUT; "
                    "several: torchrun --nproc_per_node N -m train --data OUT. "
                    "`python -m train demo` runs the synthetic end-to-end demo; `python -m train eval --checkpoint "
                    "CKPT --data OUT` evaluates a checkpoint.")
    add_options(p, TrainConfig)
    return p


def default_workers(loader: str) -> int:
    """``--workers`` when not given: reader threads = this rank's share of the cores (at most 16,
    ``loaders.default_threads``; the ranks on this node, ``LOCAL_WORLD_SIZE``, share them); worker
    processes = one fewer (the training process needs a core of its own), at most 8."""
    threads: int = default_threads()
    if loader == "threads":
        return threads
    return max(0, min(8, threads - 1))


def crop_size(args: argparse.Namespace) -> int:
    """``--crop-size``, or when not given the crop the ``--model`` is specified for (112; 224 for i3d_r50)."""
    return args.crop_size if args.crop_size is not None else model_spec(args.model).crop_size


def check_model_input(args: argparse.Namespace) -> None:
    """Refuse, in one line and before any data is read, a ``--clip-len`` or ``--crop-size`` (after
    ``--downsample``) smaller than the ``--model`` takes. A clip length left to the data is checked when the
    model is built, still before a clip is read."""
    crop = crop_size(args)
    problem = model_spec(args.model).input_problem(args.clip_len, crop // max(args.downsample, 1))
    if problem is not None:
        clip = f"--clip-len {args.clip_len} " if args.clip_len is not None else ""
        raise TrainError(f"{clip}--crop-size {crop} --downsample {args.downsample}: {problem}")


def resolve_config(args: argparse.Namespace, info: DistInfo, shape: DataShape | None = None) -> TrainConfig:
    """The run's ``TrainConfig`` from ``python -m train``'s parsed options, for this process.

    Fills in the defaults that depend on the machine (``info``: device, world
    size) and on the data (``shape``, read from ``--data`` when not given:
    clip length, clips per rank and epoch), checks the files the options name,
    and, unless ``--batch-size auto``, resolves the batch (``with_batch``).
    """
    device = info.device
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig) if hasattr(args, f.name)}
    root = check_dataset(args.data, "--data")
    if args.val_data:
        check_dataset(args.val_data, "--val-data")
    if args.finetune and not os.path.isfile(args.finetune):
        raise TrainError(f"--finetune {args.finetune}: no such file")
    if args.inflate_from and not os.path.isfile(args.inflate_from):
        raise TrainError(f"--inflate-from {args.inflate_from}: no such file")
    crop = crop_size(args)
    cache = cache_settings(args)
    shape = shape or dataset_info(root, crop, cache=cache)
    recipe = model_spec(args.model).sampling
    sampling = args.sampling or recipe.rule  # the --model's recipe unless given
    if args.clip_len is not None and args.clip_len > shape.clip_len and sampling == "clips":
        raise TrainError(f"--clip-len {args.clip_len} is longer than the stored clips of --data ({shape.clip_len} "
                         f"frames)")
    clip_len = args.clip_len or (recipe.frames if sampling == recipe.rule else None) or shape.clip_len
    if args.val_data:
        val_shape = dataset_info(args.val_data, crop, "--val-data", cache=cache)
        if val_shape.clip_len < clip_len and sampling == "clips":
            raise TrainError(f"--val-data {args.val_data}: clips of {val_shape.clip_len} frames, the model takes "
                             f"{clip_len}")
    declared = settings(TrainConfig)
    for name in ("clips_per_video", "seed"):  # before the sampler below, which would say it less plainly
        declared[name].check(getattr(args, name), TrainError)
    pad, samples = epoch_share(root, shape, loader=args.loader, epoch_mode=args.epoch_mode,
                               clips_per_video=args.clips_per_video, seed=args.seed, info=info,
                               sampling=sampling, dali_route=dali_route(
                                   sampling=sampling, short_side_scale=args.short_side_scale,
                                   random_resized_crop=args.random_resized_crop))
    auto = args.batch_size == "auto"
    given.update(
        clip_len=clip_len, crop_size=crop, device=str(device), dist_backend=info.backend,
        amp=args.amp or ("off" if device.type != "cuda" else "bf16"),
        workers=default_workers(args.loader) if args.workers is None else args.workers,
        batch_size=None, auto_batch=auto, world_size=info.world_size, epoch_samples=samples, pad_last_batch=pad,
        steps_per_epoch=None, lr_plan=None)
    pending = TrainConfig(**given)
    return pending if auto else pending.with_batch(args.batch_size)
