"""``python -m loaders.dali_check``: the DALI pipeline against the LMDB path (GPU by default).

Builds small synthetic conversions (raw and lz4), then compares train,
multi-scale and eval batches, a mid-epoch resume and ``normalize=True``
between ``DaliClipLoader`` and ``LmdbClipDataset``; exits 1 on any
difference. Run it on a machine with a GPU; ``--device cpu`` uses DALI's
CPU backend.
"""

from __future__ import annotations

import os
import sys
from typing import Sequence

import numpy as np
import torch

from .clipstore import DatasetError, open_clips
from .dali import DaliClipLoader
from .presets import ClipPreset


def _synth_roots(base: str, codecs: Sequence[str]) -> list[str]:
    """Convert a small synthetic dataset once per codec under ``base``."""
    from convert.job import JobOptions, run_job
    from convert.plan import ConvertConfig
    from convert.synth import make_dataset

    src = os.path.join(base, "videos")
    make_dataset(src, per_class=2, seconds=1.2, seed=0)
    roots = []
    for codec in codecs:
        out = os.path.join(base, codec)
        run_job(src, out, ConvertConfig(codec=codec), JobOptions(workers=min(8, os.cpu_count() or 1), progress=False))
        roots.append(out)
    return roots


def _check_against_lmdb(root: str, preset: ClipPreset, *, device_id: int | None, batch_size: int, workers: int,
                        tolerance: int) -> dict:
    """Two epochs and a resume of the DALI loader, each batch compared with ``LmdbClipDataset``."""
    import time

    from .dataset import LmdbClipDataset

    loader = DaliClipLoader(root, train=preset.train, batch_size=batch_size, preset=preset, device_id=device_id,
                            workers=workers)
    ds = LmdbClipDataset(root, train=preset.train, preset=preset)
    worst, clips, start = 0, 0, time.perf_counter()
    try:
        for epoch, position in ((0, 0), (1, 0), (1, batch_size)):
            loader.set_epoch(epoch)
            loader.set_position(position)
            seen = []
            for batch in loader:
                if device_id is not None and batch["clip"].device != torch.device("cuda", device_id):
                    raise RuntimeError(f"clips came back on {batch['clip'].device}, not cuda:{device_id}")
                ref = ds.__getitems__([(epoch, int(i)) for i in batch["index"]]).collated
                got = batch["clip"].cpu()
                if got.shape != ref["clip"].shape:
                    raise RuntimeError(f"{root}: DALI batch {tuple(got.shape)}, LMDB {tuple(ref['clip'].shape)}")
                diff = int((got.int() - ref["clip"].int()).abs().max()) if got.numel() else 0
                worst = max(worst, diff)
                if diff > tolerance:
                    raise RuntimeError(f"{root} {preset}: epoch {epoch} clips {batch['index'].tolist()} differ from "
                                       f"the LMDB path by up to {diff} (allowed {tolerance})")
                if not torch.equal(batch["label"].cpu(), ref["label"]) or batch["video_id"] != ref["video_id"]:
                    raise RuntimeError(f"{root}: labels or video ids differ at clips {batch['index'].tolist()}")
                seen.extend(batch["index"].tolist())
                clips += len(batch["index"])
            if seen != loader.indices(epoch, position).tolist():
                raise RuntimeError(f"{root}: epoch {epoch} from {position} read {seen}, "
                                   f"the sampler order is {loader.indices(epoch, position).tolist()}")
    finally:
        loader.close()
    if device_id is not None:
        torch.cuda.synchronize(device_id)
    return {"max_diff": worst, "clips": clips, "seconds": round(time.perf_counter() - start, 3)}


def _check_normalize(root: str, *, device_id: int | None, batch_size: int, workers: int) -> float:
    """Largest difference between DALI's normalised output and ``to_model_input`` of the LMDB batch."""
    from .dataset import LmdbClipDataset
    from .presets import to_model_input

    preset = ClipPreset(train=True, seed=1)
    loader = DaliClipLoader(root, train=True, batch_size=batch_size, preset=preset, device_id=device_id,
                            workers=workers, normalize=True)
    ds = LmdbClipDataset(root, train=True, preset=preset)
    worst = 0.0
    try:
        for batch in loader:
            ref = ds.__getitems__([(0, int(i)) for i in batch["index"]]).collated["clip"]
            want = to_model_input(ref, mean=preset.mean, std=preset.std, device=batch["clip"].device)
            worst = max(worst, float((batch["clip"] - want).abs().max()))
    finally:
        loader.close()
    if worst > 1e-5:
        raise RuntimeError(f"{root}: normalised DALI output differs from to_model_input by {worst}")
    return worst


def gpu_self_check(root: str | None = None, *, device_id: int | None = 0, batch_size: int = 4, workers: int = 2,
                   codecs: Sequence[str] = ("lz4", "raw")) -> dict:
    """Compare the DALI pipeline with the LMDB path; raises RuntimeError on a difference, returns what it saw.

    ``root``: a conversion to check (default: convert a small synthetic set
    once per codec in ``codecs`` into a temporary folder). For each: train
    (random crop + flip), train with multi-scale (allowed to differ by 2 grey
    levels), and eval presets, over two epochs and a mid-epoch resume; then
    ``normalize=True`` against ``to_model_input``. ``device_id=None`` runs the
    same checks on DALI's CPU backend.
    """
    import tempfile

    if device_id is not None and not torch.cuda.is_available():
        raise RuntimeError("gpu_self_check: torch sees no CUDA device (pass device_id=None for the CPU backend)")
    results: dict = {"device": "cpu" if device_id is None else torch.cuda.get_device_name(device_id)}
    with tempfile.TemporaryDirectory(prefix="dali_check_") as tmp:
        roots = [root] if root is not None else _synth_roots(tmp, codecs)
        for r in roots:
            name = open_clips(r).manifest["codec"] if root is None else r
            presets = {"train": (ClipPreset(train=True, seed=1, clip_len=8), 0),
                       "multiscale": (ClipPreset(train=True, seed=1, multiscale=(1.0, 0.875, 0.75, 0.66)), 2),
                       "eval": (ClipPreset(train=False, seed=1), 0)}
            for label, (preset, tolerance) in presets.items():
                got = _check_against_lmdb(r, preset, device_id=device_id, batch_size=batch_size, workers=workers,
                                          tolerance=tolerance)
                results[f"{name}/{label}"] = got
                print(f"{name:>8} {label:<10} ok: {got['clips']} clips in {got['seconds']} s, "
                      f"max diff {got['max_diff']}", flush=True)
            worst = _check_normalize(r, device_id=device_id, batch_size=batch_size, workers=workers)
            results[f"{name}/normalize"] = worst
            print(f"{name:>8} normalize  ok: max diff {worst:.2e}", flush=True)
    return results


def _main(argv: Sequence[str]) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m loaders.dali",
                                description="Check the DALI pipeline against the LMDB path (GPU by default).")
    p.add_argument("root", nargs="?", help="a conversion to check (default: a small synthetic one)")
    p.add_argument("--device", default="0", help="CUDA device number, or 'cpu' for DALI's CPU backend")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=4)
    args = p.parse_args(argv)
    device_id = None if args.device == "cpu" else int(args.device)
    try:
        gpu_self_check(args.root, device_id=device_id, batch_size=args.batch_size, workers=args.workers)
    except (RuntimeError, ValueError, DatasetError) as exc:
        print(f"DALI check FAILED: {exc}")
        return 1
    print("DALI check passed")
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
