"""``python -m train demo [--out DIR]``: the end-to-end demo on the CPU.

1. If ``OUT/clips_train`` and ``OUT/clips_val`` are not there yet, run the
   conversion demo (``python -m convert demo --out OUT``: synthetic motion
   videos, 16 per class for training and 4 for validation, converted to LMDB
   shards of 16x128x171 clips).
2. Train C3D from scratch on the CPU for about two minutes on two cores with
   the recipe below, evaluating on the validation videos.
3. Print clip- and video-level validation accuracy and where the checkpoint,
   metrics and figures are.

The recipe (``RECIPE``), tuned for two CPU cores (about 300 steps):

* width 1/8 of C3D (conv channels 8..64, fc 512) with BatchNorm: BN makes a
  from-scratch run converge in a few hundred steps;
* 128x128 crops (the full frame height) averaged down to 64x64 on the device:
  a quarter of the compute of 128x128 while the whole moving square stays in
  view;
* RGB channels permuted per clip (``--colour-permutation``): colours are
  random per video, and without this the small model memorises the 80
  training videos by colour (train loss falls, validation stays near chance)
  instead of learning motion;
* no horizontal flip: flipping turns "move left" into "move right";
* AdamW, lr 1e-3 with a 20-step warm-up and cosine decay, batch 16,
  dropout 0.2, 19 epochs of the 259 training clips.

Chance is 20% (five classes); the video-level score averages the softmax over
all clips of a video.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from convert.format.options import OneLineParser, settings
from convert.options import DemoOptions

from .config import TrainConfig
from .errors import TrainError

RECIPE = ["--model-width", "0.125", "--bn", "--crop-size", "128", "--downsample", "2", "--no-flip",
          "--colour-permutation", "--dropout", "0.2", "--optimizer", "adamw", "--lr", "1e-3", "--no-lr-scaling",
          "--weight-decay", "0.05", "--schedule", "cosine", "--warmup-steps", "20", "--batch-size", "16",
          "--epochs", "19", "--eval-every", "5", "--log-every", "8", "--device", "cpu"]


def data_paths(out: str) -> tuple[str, str]:
    """Where the conversion demo writes its training and validation splits: ``OUT/clips_train``, ``OUT/clips_val``."""
    return os.path.join(out, "clips_train"), os.path.join(out, "clips_val")


def ensure_data(out: str, workers: int) -> tuple[str, str]:
    """``OUT/clips_train`` and ``OUT/clips_val``, made by the conversion demo when missing."""
    train, val = data_paths(out)
    if all(os.path.exists(os.path.join(p, "manifest.json")) for p in (train, val)):
        print(f"using the converted synthetic dataset in {out}", flush=True)
        return train, val
    from convert.tools import demo as convert_demo

    print(f"no converted dataset in {out}: running the conversion demo first", flush=True)
    if convert_demo(out, per_class=16, seconds=2.0, workers=workers, codec="raw") != 0:
        raise TrainError("the conversion demo failed")
    return train, val


def demo(out: str, *, workers: int = 1, threads: int | None = None, extra: list[str] | None = None) -> dict:
    """Convert if needed, train with ``RECIPE`` (plus ``extra`` options), return the run summary.

    The trainer's options are parsed first, so a mistyped one stops the demo
    before the conversion, which takes a while.
    """
    from .args import build_parser
    from .main import run

    train, val = data_paths(out)
    argv = ["--data", train, "--val-data", val, "--out", os.path.join(out, "train"), "--workers", str(workers),
            "--overwrite", *RECIPE]
    if threads:
        argv += ["--threads", str(threads)]
    argv += extra or []
    args = build_parser().parse_args(argv)
    ensure_data(out, workers=0)
    print("training: python -m train " + " ".join(argv), flush=True)
    t0 = time.perf_counter()
    summary = run(args)
    summary["wall_seconds"] = time.perf_counter() - t0
    return summary


def build_parser() -> argparse.ArgumentParser:
    """The demo's own options; the others it is given go to the trainer (``demo``'s ``extra``)."""
    p = OneLineParser(raise_as=TrainError, prog="python -m train demo", description=__doc__,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    settings(DemoOptions)["out"].add_to(p, help="folder of the conversion demo (python -m convert demo's --out)")
    declared = settings(TrainConfig)
    declared["workers"].add_to(p, default=1, help="reader threads of the trainer's default --loader threads "
                                                  "(worker processes with --loader processes); the demo is "
                                                  "tuned for two cores")
    declared["threads"].add_to(p, help="math threads (default: PyTorch's choice)")
    return p


def main(argv: list[str]) -> int:
    """``python -m train demo``; returns the exit status (2 with a one-line message for usage and setup errors,
    1 with one for a failure of the machine such as a full disk, 1 when the model did not learn)."""
    from .main import print_summary

    try:
        args, extra = build_parser().parse_known_args(argv)
        summary = demo(args.out, workers=args.workers, threads=args.threads, extra=extra)
    except TrainError as exc:
        print(f"train demo: error: {exc}", file=sys.stderr)
        return exc.status
    print_summary(summary, per_class=True)
    if summary["eval"]["video_top1"] < 0.5:
        print("the demo model did not learn well enough (video top-1 < 50%)", file=sys.stderr)
        return 1
    return 0
