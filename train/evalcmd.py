"""``python -m train eval --checkpoint CKPT --data OUT``: evaluate a trained model, print and save the report.

CKPT is a checkpoint file, or a run's folder (its ``--out``), whose newest
intact checkpoint is taken and named. ``--data`` may be a URL, read through
the shard cache (``--cache-dir``, ``--cache-limit``, as in training).

The model is rebuilt from the ``TrainConfig`` the checkpoint stores (``--model``,
width, BatchNorm, crop, downsampling, clip length; a checkpoint written before
``--model`` existed is C3D's); ``--eval-protocol`` chooses the
protocol as in training, and the clips are read and cropped as the trainer's
evaluation reads them (the checkpoint's config with this command's protocol,
loader, batch and device). The report goes to ``OUT/eval/<name>.json`` with its confusion
matrix beside it (``--out``, default the checkpoint's folder). ``--export
FILE.npz`` also writes, per video (sorted by id): ``video_ids``, ``labels``,
``probs`` (mean softmax over its views), the model's video features averaged
over the views (``ModelSpec.features``: C3D's ``fc6`` and ``fc7`` after their
ReLU; the ResNets' and I3D's globally pooled ``pool``), plus ``classes`` and
``protocol``.
Runs under torchrun too (views split over ranks, rank 0 writes).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from convert.format.options import OneLineParser, add_options, option, settings
from convert.store.cache import add_cache_options

from . import checkpoint as ckpt_io
from . import dist
from .args import default_workers
from .config import TrainConfig
from .data import build_eval_data, cache_settings, dataset_info
from .engine import evaluate
from .errors import TrainError
from .main import eval_line, model_options, save_eval, torch_threads
from .metrics import SCORES
from .models import build_model, strip_prefixes
from .readerrors import reading
from .runfiles import checkpoint_eval_name
from .workers import end_workers_at_exit


@dataclasses.dataclass(frozen=True, kw_only=True)
class EvalOptions:
    """The options of ``python -m train eval`` that are no setting of a run (those are ``TrainConfig``'s)."""

    checkpoint: str = option("evaluation", "a trainer checkpoint (checkpoint*.pt), or a run's folder (its --out): "
                                           "its newest intact checkpoint", metavar="CKPT", required=True)
    data: str = option("evaluation", "conversion to evaluate on (same class list)", metavar="OUT", required=True)
    out: str | None = option("evaluation", "folder for eval/NAME.json (without it: the checkpoint's folder)")
    export: str | None = option("evaluation", "also write per-video scores and mean video features (C3D: fc6/fc7) "
                                              "to this .npz", metavar="FILE")


def build_parser() -> argparse.ArgumentParser:
    """``python -m train eval``'s options; those that are settings of a run are checked as the trainer's are."""
    p = OneLineParser(raise_as=TrainError, prog="python -m train eval", description=__doc__,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    add_options(p, EvalOptions)
    declared = settings(TrainConfig)
    declared["eval_protocol"].add_to(p, help="clips: every stored clip, centre crop; NxM (10x3, 4x3, 2x3, 8x1...): "
                                             "N views x M crops (1 or 3) per video; 10x3 takes N from --eval-clips")
    declared["eval_clips"].add_to(p, help="clips per video with 10x3")
    declared["eval_batch_size"].add_to(p, flags=["--batch-size"], default=16, help="views per batch")
    declared["loader"].add_to(p, choices=("threads", "processes"),
                              help="threads: reader threads in this process; processes: DataLoader worker processes")
    declared["workers"].add_to(p, help="reader threads or worker processes (default: as the trainer's, from this "
                                       "machine's cores)")
    declared["verify_data"].add_to(p, help="check every clip's CRC-32 as it is read")
    add_cache_options(p)  # as every command reading a URL takes them, the trainer too
    declared["device"].add_to(p, help="auto, cpu or cuda")
    declared["amp"].add_to(p, help="default bf16 on CUDA, off on the CPU")
    declared["threads"].add_to(p, help="CPU math threads (default: PyTorch's choice)")
    declared["no_progress"].add_to(p, help="no progress bar")
    return p


def checkpoint_to_evaluate(named: str, say: Callable[[str], None] | None) -> tuple[str, dict[str, Any]]:
    """(path, contents) of the checkpoint ``--checkpoint`` names: that file (``load_named``: one line when it is
    damaged), or for a folder (a run's ``--out``) its newest intact checkpoint, which ``say`` is told."""
    if not os.path.isdir(named):
        return named, ckpt_io.load_named(named, say=say)
    path, saved = ckpt_io.newest_in_folder(named, "--checkpoint", say or (lambda text: None))
    if say is not None:
        best = ckpt_io.best_path(named)
        other = f" (the best on validation: {best})" if os.path.isfile(best) and not os.path.samefile(best, path) \
            else ""
        say(f"--checkpoint {named} is a folder: evaluating its newest intact checkpoint, {path} (step "
            f"{saved.get('step', '?')}); name a file to evaluate another{other}")
    return path, saved


def load_model(saved: dict[str, Any], cfg: TrainConfig, path: str, classes: list[str]) -> nn.Module:
    """The model that ``cfg`` (the config of checkpoint ``saved``, read from ``path``) describes, with its weights."""
    try:
        model = build_model(cfg.model, num_classes=len(classes), clip_len=cfg.clip_len, crop_size=cfg.model_crop,
                            **model_options(cfg))
    except ValueError as exc:
        raise TrainError(f"checkpoint {path}: its settings do not make a model ({exc})") from exc
    try:
        model.load_state_dict(strip_prefixes(ckpt_io.model_state(saved)))
    except RuntimeError as exc:
        raise TrainError(f"checkpoint {path}: weights do not fit the model its settings describe "
                         f"({str(exc).splitlines()[0]})") from exc
    return model


def eval_config(trained: TrainConfig, opts: argparse.Namespace, info: dist.DistInfo) -> TrainConfig:
    """The checkpoint's config with this evaluation's reading (the shard cache of a URL too), protocol, batch and
    device settings."""
    cuda = info.device.type == "cuda"
    return dataclasses.replace(
        trained, eval_protocol=opts.eval_protocol, eval_clips=opts.eval_clips, eval_batch_size=opts.eval_batch_size,
        loader=opts.loader, workers=default_workers(opts.loader) if opts.workers is None else opts.workers,
        verify_data=opts.verify_data, device=str(info.device), amp=opts.amp or ("bf16" if cuda else "off"),
        channels_last=trained.channels_last and cuda, cache_dir=opts.cache_dir, cache_limit=opts.cache_limit)


def run(opts: argparse.Namespace) -> dict[str, Any]:
    """Evaluate as the options say; returns the result (with ``files``) on rank 0."""
    info = dist.init_distributed(opts.device)
    path, saved = checkpoint_to_evaluate(opts.checkpoint, say=print if info.is_main else None)
    trained = ckpt_io.saved_config(saved, path)
    cfg = eval_config(trained, opts, info)
    shape = dataset_info(opts.data, trained.crop_size, cache=cache_settings(cfg))
    ckpt_io.check_classes(saved, shape.classes, path)
    if shape.clip_len < trained.clip_len:
        raise TrainError(f"--data {opts.data}: clips of {shape.clip_len} frames, the model takes {trained.clip_len}")
    model = load_model(saved, trained, path, shape.classes)
    model.to(info.device).eval()
    if cfg.channels_last:
        model.to(memory_format=torch.channels_last_3d)  # type: ignore[call-overload]  # torch's stub lacks it
    data = build_eval_data(opts.data, cfg, info, "--data")
    try:
        with reading("--data", opts.data):
            result = evaluate(model, data, info.device, cfg.amp_dtype, channels_last=cfg.channels_last,
                              downsample=cfg.downsample,
                              progress=info.is_main and not opts.no_progress and sys.stderr.isatty(),
                              features=opts.export is not None)
    finally:
        data.close()  # its threads or DALI pipeline now, not at garbage collection
    result["checkpoint"], result["step"] = os.path.abspath(path), int(saved.get("step", 0))
    if info.is_main:
        out = opts.out or os.path.dirname(os.path.abspath(path))
        name = checkpoint_eval_name(os.path.basename(os.path.normpath(opts.data)), result["protocol"]["name"],
                                    result["step"])
        result["files"] = save_eval(out, name, result)
        print(f"eval of {path} (step {result['step']}) on {opts.data} {eval_line(result)}")
        print(f"eval results:      {result['files']['json']}")
        print(f"confusion matrix:  {result['files']['confusion_png']}")
        if opts.export:
            export(opts.export, result)
            print(f"export:            {opts.export}")
    dist.barrier()
    return result


def export(path: str, result: dict[str, Any]) -> str:
    """The per-video scores and features of ``result`` as an .npz (written to a temporary name, then renamed)."""
    scores = result["video_scores"]
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f".{os.path.basename(path)}.tmp.{os.getpid()}.npz")
    features = {name: values for name, values in scores.items() if name not in SCORES}
    np.savez(tmp, video_ids=scores["video_ids"], labels=scores["labels"], probs=scores["probs"],
             views=scores["views"], **features, classes=np.array(result["classes"]),
             protocol=np.array(json.dumps(result["protocol"])))
    os.replace(tmp, path)
    return path


def main(argv: list[str]) -> int:
    """``python -m train eval``; returns the exit status (2 with a one-line message for usage and setup errors)."""
    end_workers_at_exit()  # where an evaluation starts: its worker processes are ended at exit
    try:
        opts = build_parser().parse_args(argv)
        with torch_threads(opts.threads):
            run(opts)
    except TrainError as exc:
        print(f"train eval: error: {exc}", file=sys.stderr)
        return 2
    finally:
        dist.cleanup()
    return 0
