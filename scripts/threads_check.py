"""``python scripts/threads_check.py [ROOT] --device 0``: the threaded loader's pinned ring against a real GPU.

Each batch of ``build_loader(threads=N)`` is copied to the device with
``non_blocking=True`` behind a deliberately slow GPU kernel, so the copies
run well after the loader was asked for the next batches; the ring must not
refill a slot before its copy is done (the loader waits on a CUDA event).
Every batch that arrived on the device is then compared with the same batch
from the DataLoader path (``workers=0``). Exit 0 when all are equal. Without
ROOT it converts a small synthetic set per codec (raw, lz4, jpeg) first. With
``--device cpu`` it runs the same comparison without a GPU (the test suite
does).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout, when not installed

from loaders import ClipDataset, build_loader  # noqa: E402


def check(root: str, *, device: str, threads: int = 2, batch_size: int = 8, epochs: int = 2,
          delay: int = 2048) -> dict:
    """{"batches", "mismatches"} over ``epochs`` epochs of ``root`` through the threaded loader on ``device``."""
    dev = torch.device(device if device == "cpu" else f"cuda:{int(device)}")
    ds = ClipDataset(root, train=True)
    cuda = dev.type == "cuda"
    if cuda:
        torch.cuda.set_device(dev)
    threaded = build_loader(ds, batch_size=batch_size, threads=threads, pin_memory=cuda, prefetch_factor=2)
    reference = build_loader(ds, batch_size=batch_size, workers=0, pin_memory=False)
    slow = torch.randn(delay, delay, device=dev) if cuda else None
    batches = mismatches = 0
    for epoch in range(epochs):
        threaded.sampler.set_epoch(epoch)
        reference.sampler.set_epoch(epoch)
        arrived = []
        for batch in threaded:
            if slow is not None:
                slow @ slow  # queued before the copy: the copy starts late, after next() has returned
            arrived.append(batch["clip"].to(dev, non_blocking=True, copy=True))  # copy: on the CPU too
        if cuda:
            torch.cuda.synchronize(dev)
        for got, want in zip(arrived, reference):
            batches += 1
            mismatches += int(not torch.equal(got.cpu(), want["clip"]))
    threaded.close()
    return {"batches": batches, "mismatches": mismatches, "pinned": threaded.pin_memory}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python scripts/threads_check.py", description=__doc__.split("\n\n")[0])
    p.add_argument("root", nargs="?", help="a finished conversion (default: small synthetic raw, lz4 and jpeg ones)")
    p.add_argument("--device", default="0", help="CUDA device number, or cpu (default 0)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--epochs", type=int, default=2)
    args = p.parse_args(argv)
    if args.device != "cpu" and not torch.cuda.is_available():
        print("threads_check: no CUDA device here (use --device cpu for the CPU-only comparison)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="threads-check-") as tmp:
        if args.root:
            roots = [args.root]
        else:
            from convert.synth import synthetic_conversions
            from convert.worker.plan import ConvertConfig

            codecs = ("raw", "lz4", "jpeg")
            made = synthetic_conversions(tmp, {c: ConvertConfig(codec=c) for c in codecs}, per_class=4, seconds=2.0)
            roots = [made[c] for c in codecs]
        failed = 0
        for root in roots:
            r = check(root, device=args.device, threads=args.threads, epochs=args.epochs)
            print(f"threads_check: {root}: {r['batches']} batches on {args.device} (pinned ring: {r['pinned']}), "
                  f"{r['mismatches']} differ from the DataLoader path")
            failed += r["mismatches"] > 0 or r["batches"] == 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
