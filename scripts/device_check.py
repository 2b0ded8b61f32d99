"""GPU check for the trainer: full-size C3D from synthetic LMDB shards, bf16 and fp16, one table.

    python scripts/device_check.py            # on a CUDA machine (about 5 minutes on one H200)
    python scripts/device_check.py --smoke    # anywhere: tiny width and steps, CPU-only configurations

For each configuration (loader lmdb, and dali when ``nvidia.dali`` imports;
AMP bf16 and fp16) it finds the largest per-GPU batch that fits (the
``--batch-size auto`` logic), trains ``--steps`` optimizer steps at
``--batch`` clips with channels_last, and prints clips/s, model FLOPs
utilisation (C3D: ~38.5 GMACs forward per 16x112x112 clip, so ~231e9 FLOP
forward + backward; H200 dense bf16/fp16 peak ~989e12 FLOP/s), the fraction of
step time spent waiting for data, peak memory and that largest batch. Results
also go to WORK/device_check.json.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import torch  # noqa: E402

from train import TrainError  # noqa: E402
from train.main import run_argv  # noqa: E402

FLOP_PER_CLIP = 231e9  # forward + backward, 16x112x112, full width
PEAK_FLOPS = 989e12  # H200 dense bf16 / fp16 tensor-core peak


def _synth_class(args: tuple[str, str, int, float, int]) -> None:
    from convert.synth import make_dataset

    src, cls, per_class, seconds, seed = args
    make_dataset(src, per_class=per_class, seconds=seconds, seed=seed, classes=(cls,))


def build_shards(work: str, *, per_class: int, seconds: float, size: tuple[int, int], workers: int) -> str:
    """Synthetic videos (one process per class) converted to LMDB shards under WORK/clips_train."""
    from convert.job import JobOptions, run_job
    from convert.plan import ConvertConfig
    from convert.synth import CLASSES

    dst = os.path.join(work, "clips_train")
    if os.path.exists(os.path.join(dst, "manifest.json")):
        return dst
    src = os.path.join(work, "videos")
    with ProcessPoolExecutor(max_workers=min(len(CLASSES), workers)) as pool:
        list(pool.map(_synth_class, [(src, c, per_class, seconds, k) for k, c in enumerate(CLASSES)]))
    run_job(src, dst, ConvertConfig(size=size), JobOptions(workers=workers, progress=False))
    return dst


def dali_importable() -> bool:
    try:
        importlib.import_module("nvidia.dali")
    except (ImportError, OSError):  # OSError: the wheel is there but a CUDA library is not
        return False
    return True


def largest_batch(width: float, crop: int, amp: str, device: torch.device) -> int | None:
    """The ``--batch-size auto`` answer for this configuration (None on the CPU)."""
    if device.type != "cuda":
        return None
    from train.autobatch import find_batch_size
    from train.model import C3D

    model = C3D(5, width=width, crop_size=crop).to(device).to(memory_format=torch.channels_last_3d)
    batch, _ = find_batch_size(model, shape=(16, crop, crop), num_classes=5, device=device,
                               amp_dtype={"bf16": torch.bfloat16, "fp16": torch.float16}[amp], channels_last=True,
                               headroom=0.85)
    del model
    torch.cuda.empty_cache()
    return batch


def run_config(data: str, work: str, loader: str, amp: str, opts: argparse.Namespace,
               device: torch.device) -> dict:
    out = os.path.join(work, f"run_{loader}_{amp}")
    argv = ["--data", data, "--out", out, "--loader", loader, "--amp", amp, "--model-width", str(opts.width),
            "--crop-size", str(opts.crop), "--batch-size", str(opts.batch), "--max-steps", str(opts.steps),
            "--epochs", "1000", "--eval-every", "0", "--log-every", str(opts.log_every), "--no-progress",
            "--no-tensorboard", "--lr", "0.003", "--workers", str(opts.workers), "--device", device.type,
            "--overwrite"]
    if device.type == "cuda":
        argv.append("--channels-last")
        torch.cuda.reset_peak_memory_stats(device)
    row = {"loader": loader, "amp": amp, "batch": opts.batch}
    t0 = time.perf_counter()
    try:
        s = run_argv(argv)
    except TrainError as exc:
        return {**row, "error": str(exc)}
    row.update(clips_per_s=s.get("clips_per_s"), data_wait=s.get("data_wait_frac"), peak_mb=s.get("peak_mem_mb"),
               seconds=time.perf_counter() - t0, final_loss=s.get("final_loss"))
    if row["clips_per_s"] is not None:
        # Work per clip scales with width^2 (channels in x out) and crop area; exact at width 1 and crop 112.
        flop = FLOP_PER_CLIP * opts.width ** 2 * (opts.crop / 112) ** 2
        row["mfu"] = row["clips_per_s"] * flop / PEAK_FLOPS
    gc.collect()  # drop the run's model and optimizer before probing memory
    if device.type == "cuda":
        torch.cuda.empty_cache()
    try:
        row["max_batch"] = largest_batch(opts.width, opts.crop, amp, device)
    except TrainError as exc:
        row["max_batch_error"] = str(exc)
    return row


def table(rows: list[dict]) -> str:
    head = "| loader | amp | batch | clips/s | MFU | data wait | peak MiB | max batch | note |"
    lines = [head, "|" + "---|" * 9]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['loader']} | {r['amp']} | {r['batch']} | - | - | - | - | - | {r['error']} |")
            continue
        mb = r.get("max_batch")
        lines.append(f"| {r['loader']} | {r['amp']} | {r['batch']} | {r['clips_per_s']:.1f} | {r['mfu']:.1%} | "
                     f"{r['data_wait']:.1%} | {r['peak_mb']:.0f} | {mb if mb is not None else 'n/a (CPU)'} | "
                     f"{r.get('note', '')} |")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="scripts/device_check.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="tiny width, crop and steps; runs on the CPU")
    p.add_argument("--data", help="use this conversion instead of building synthetic shards")
    p.add_argument("--work", default="device_check_out", help="folder for shards, runs and device_check.json "
                   "(the compose service passes /out/device_check, the mounted output folder)")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps per configuration")
    p.add_argument("--batch", type=int, default=None, help="clips per step (default 64; smoke 8)")
    p.add_argument("--workers", type=int, default=None, help="loader processes (default: cores - 2, max 12)")
    return p


def main() -> int:
    opts = build_parser().parse_args()
    cuda = torch.cuda.is_available() and not opts.smoke
    device = torch.device("cuda" if cuda else "cpu")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 2)
    opts.width, opts.crop = (1.0, 112) if not opts.smoke else (0.0625, 32)
    opts.steps = opts.steps or (40 if not opts.smoke else 4)
    opts.batch = opts.batch or (64 if not opts.smoke else 8)
    opts.log_every = 5 if not opts.smoke else 2
    opts.workers = opts.workers if opts.workers is not None else (min(12, max(cores - 2, 1)) if cuda else 0)
    if not cuda and not opts.smoke:
        print("no CUDA device: running the CPU smoke configuration instead (pass --smoke to say so)")
        opts.smoke = True
        opts.width, opts.crop, opts.steps, opts.batch, opts.log_every = 0.0625, 32, 4, 8, 2
    os.makedirs(opts.work, exist_ok=True)
    t0 = time.perf_counter()
    if opts.data:
        data = opts.data
    else:
        size = (128, 171) if not opts.smoke else (40, 52)
        per_class, seconds = (24, 4.0) if not opts.smoke else (2, 2.0)
        data = build_shards(opts.work, per_class=per_class, seconds=seconds, size=size, workers=max(cores, 2))
    print(f"data: {data} (ready in {time.perf_counter() - t0:.0f} s); device {device}"
          + (f" ({torch.cuda.get_device_name(device)})" if cuda else ""), flush=True)
    loaders = ["lmdb"] + (["dali"] if dali_importable() else [])
    rows = []
    for loader in loaders:
        for amp in ("bf16", "fp16"):
            if amp == "fp16" and not cuda:
                rows.append({"loader": loader, "amp": amp, "batch": opts.batch, "error": "fp16 needs CUDA: skipped"})
                continue
            print(f"--- {loader} {amp} ---", flush=True)
            rows.append(run_config(data, opts.work, loader, amp, opts, device))
    if "dali" not in loaders:
        rows.append({"loader": "dali", "amp": "-", "batch": "-", "error": "nvidia.dali not importable: skipped"})
    print()
    print(f"C3D width {opts.width}, crop {opts.crop}, {opts.steps} steps per configuration; "
          f"MFU = clips/s x {FLOP_PER_CLIP:.3g} FLOP x width^2 x (crop/112)^2 / {PEAK_FLOPS:.3g} FLOP/s")
    print(table(rows))
    with open(os.path.join(opts.work, "device_check.json"), "w") as f:
        json.dump({"device": str(device), "width": opts.width, "crop": opts.crop, "rows": rows}, f, indent=1)
    print(f"total {time.perf_counter() - t0:.0f} s; results in {os.path.join(opts.work, 'device_check.json')}")
    failed = [r for r in rows if "error" in r and "skipped" not in r["error"]]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
