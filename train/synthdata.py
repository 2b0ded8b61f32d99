"""Converted synthetic datasets for the demo, the device check and the tests (no downloads).

The videos come from ``convert.synth`` (five motion classes) and go through
the real conversion (``convert.job.run_job``), so training reads exactly what
a converted real dataset would give it.
"""

from __future__ import annotations

import os
import sys

from convert.job import JobOptions, run_job
from convert.plan import ConvertConfig
from convert.synth import make_dataset


def converted_split(out: str, split: str, *, per_class: int, seconds: float = 2.0, seed: int = 0,
                    size: tuple[int, int] = (128, 171), max_clips: int | None = None, workers: int = 0,
                    codec: str = "raw") -> str:
    """``OUT/clips_<split>`` from ``per_class`` synthetic videos per class; reused when already complete."""
    dst = os.path.join(out, f"clips_{split}")
    if os.path.exists(os.path.join(dst, "manifest.json")):
        return dst
    src = os.path.join(out, "videos", split)
    make_dataset(src, per_class=per_class, seconds=seconds, seed=seed)
    run_job(src, dst, ConvertConfig(codec=codec, size=size, max_clips=max_clips),
            JobOptions(workers=workers, progress=sys.stderr.isatty()))
    return dst
