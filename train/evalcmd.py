"""``python -m train eval --checkpoint CKPT --data OUT``: evaluate a trained C3D, print and save the report.

The model is rebuilt from the settings the checkpoint stores (width, BatchNorm,
crop, downsampling, clip length); ``--eval-protocol`` chooses the protocol as
in training. The report goes to ``OUT/eval/<name>.json`` with its confusion
matrix beside it (``--out``, default the checkpoint's folder). ``--export
FILE.npz`` also writes, per video (sorted by id): ``video_ids``, ``labels``,
``probs`` (mean softmax over its views), ``fc6`` and ``fc7`` (C3D's features,
after their ReLU, averaged over the views), plus ``classes`` and ``protocol``.
Runs under torchrun too (views split over ranks, rank 0 writes).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import numpy as np
import torch

from . import checkpoint as ckpt_io
from . import dist
from .data import PROTOCOLS, build_eval_data, dataset_info
from .engine import evaluate
from .errors import TrainError
from .model import C3D, strip_prefixes

AMP = {"bf16": torch.bfloat16, "fp16": torch.float16, "off": None}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m train eval", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, metavar="CKPT", help="a trainer checkpoint (checkpoint*.pt)")
    p.add_argument("--data", required=True, metavar="OUT", help="conversion to evaluate on (same class list)")
    p.add_argument("--eval-protocol", default="clips", choices=PROTOCOLS,
                   help="clips: every stored clip, centre crop (default); 10x3: --eval-clips uniformly spaced "
                        "clips x 3 crops per video")
    p.add_argument("--eval-clips", type=int, default=10, help="clips per video with 10x3 (default 10)")
    p.add_argument("--out", default=None, help="folder for eval/NAME.json (default: the checkpoint's folder)")
    p.add_argument("--export", metavar="FILE", default=None,
                   help="also write per-video scores and mean fc6/fc7 features to this .npz")
    p.add_argument("--batch-size", type=int, default=16, help="views per batch (default 16)")
    p.add_argument("--workers", type=int, default=None, help="loader processes (default: as the trainer)")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")
    p.add_argument("--amp", default=None, choices=tuple(AMP), help="default bf16 on CUDA, off on the CPU")
    p.add_argument("--threads", type=int, default=None, help="CPU math threads (default: PyTorch's choice)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def load_model(saved: dict[str, Any], path: str, classes: list[str], clip_len: int) -> tuple[C3D, dict]:
    """The C3D a trainer checkpoint describes, with its weights; and the training settings it holds."""
    targs = saved.get("args")
    if not isinstance(targs, dict) or "model_width" not in targs:
        raise TrainError(f"checkpoint {path} holds no training settings (not written by python -m train)")
    model = C3D(len(classes), width=float(targs["model_width"]), bn=bool(targs["bn"]), clip_len=clip_len,
                crop_size=int(targs["crop_size"]) // int(targs.get("downsample", 1)))
    try:
        model.load_state_dict(strip_prefixes(ckpt_io.model_state(saved)))
    except RuntimeError as exc:
        raise TrainError(f"checkpoint {path}: weights do not fit the model its settings describe "
                         f"({str(exc).splitlines()[0]})") from exc
    return model, targs


def run(opts: argparse.Namespace) -> dict[str, Any]:
    """Evaluate as the options say; returns the result (with ``files``) on rank 0."""
    from .args import default_workers
    from .main import eval_line, save_eval

    info = dist.init_distributed(opts.device)
    if opts.eval_clips < 1 or opts.batch_size < 1:
        raise TrainError("--eval-clips and --batch-size must be at least 1")
    saved = ckpt_io.load(opts.checkpoint)
    targs = saved.get("args") or {}
    crop = int(targs.get("crop_size", 112))
    shape = dataset_info(opts.data, crop)
    ckpt_io.check_classes(saved, shape.classes, opts.checkpoint)
    clip_len = targs.get("clip_len") or shape.clip_len
    model, targs = load_model(saved, opts.checkpoint, shape.classes, clip_len)
    model.to(info.device).eval()
    channels_last = bool(targs.get("channels_last")) and info.device.type == "cuda"
    if channels_last:
        model.to(memory_format=torch.channels_last_3d)
    amp = opts.amp or ("bf16" if info.device.type == "cuda" else "off")
    ns = argparse.Namespace(crop_size=crop, clip_len=targs.get("clip_len"), seed=int(targs.get("seed", 0)),
                            eval_protocol=opts.eval_protocol, eval_clips=opts.eval_clips, loader="lmdb",
                            eval_batch_size=opts.batch_size, batch_size=opts.batch_size,
                            workers=default_workers(info.world_size) if opts.workers is None else opts.workers)
    data = build_eval_data(opts.data, ns, info)
    result = evaluate(model, data, info.device, AMP[amp], channels_last=channels_last,
                      downsample=int(targs.get("downsample", 1)),
                      progress=info.is_main and not opts.no_progress and sys.stderr.isatty(),
                      features=opts.export is not None)
    result["checkpoint"], result["step"] = os.path.abspath(opts.checkpoint), int(saved.get("step", 0))
    if info.is_main:
        out = opts.out or os.path.dirname(os.path.abspath(opts.checkpoint))
        name = f"{os.path.basename(os.path.normpath(opts.data))}_{result['protocol']['name']}_step{result['step']}"
        result["files"] = save_eval(out, name, result)
        print(f"eval of {opts.checkpoint} (step {result['step']}) on {opts.data} {eval_line(result)}")
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
    np.savez(tmp, video_ids=scores["video_ids"], labels=scores["labels"], probs=scores["probs"],
             views=scores["views"], fc6=scores["fc6"], fc7=scores["fc7"], classes=np.array(result["classes"]),
             protocol=np.array(json.dumps(result["protocol"])))
    os.replace(tmp, path)
    return path


def main(argv: list[str]) -> int:
    opts = build_parser().parse_args(argv)
    before = torch.get_num_threads()
    if opts.threads:
        torch.set_num_threads(opts.threads)
    try:
        run(opts)
    except TrainError as exc:
        print(f"train eval: error: {exc}", file=sys.stderr)
        return 2
    finally:
        torch.set_num_threads(before)
        dist.cleanup()
    return 0
