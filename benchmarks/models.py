"""``python -m benchmarks.models``: every network of the registry side by side, on the CPU, in one run.

Per model (``train.models.MODELS``): parameters at 400 classes, forward
GFLOPs per clip measured with ``torch.utils.flop_counter`` (convolutions and
matrix products, a multiply-add counted as 2 FLOPs; ``--clip-len`` x
``--crop``², default 16 x 112, the input the trainer's data holds) beside
the figure the registry records at the model's own input, and CPU training
speed: clips/s of whole training steps (forward, backward, SGD step, random
clips, under ``--amp``), after ``--warmup`` steps, in interleaved ``--rounds``
(these machines are noisy: each row shows its best round), with
``--threads`` math threads. The achieved GFLOP/s counts a training step as 3
forward passes. The activations saved for the backward pass, per clip in
float32 (MiB): every tensor autograd keeps from one clip's forward pass
(``torch.autograd.graph.saved_tensors_hooks``), counted once per storage and
without the weights; bf16 autocast keeps about half. That is what a batch
costs beyond the weights, gradients and optimizer state.

Full-size networks take seconds per clip on a CPU: ``--batch 2 --steps 2``
(the defaults) keep the whole run within a few minutes on 2 cores;
``--width`` scales every channel count for a quick look (the FLOPs then fall
with width²). Nothing here asserts a figure: the table is the output, and
docs/benchmarks.md records it.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

from train.models import MODELS, build_model, count_parameters, flops_per_clip


def parameters(name: str, *, width: float = 1.0, classes: int = 400) -> int:
    """Trainable parameters of ``name`` at ``width`` for ``classes`` classes."""
    spec = MODELS[name]
    with torch.device("meta"):
        return count_parameters(build_model(name, num_classes=classes, clip_len=spec.clip_len,
                                            crop_size=spec.crop_size, width=width))


def saved_bytes(model: nn.Module, clip: torch.Tensor) -> int:
    """Bytes of the tensors autograd saves for the backward pass of ``model(clip)`` (weights left out; a
    storage saved by several layers counted once)."""
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[tuple[int, int, tuple[int, ...]], int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in weights:
            saved[(ptr, int(t.storage_offset()), tuple(int(d) for d in t.shape))] = t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(clip)
    return sum(saved.values())


class Trainer:
    """One model's training step on random clips, timed."""

    def __init__(self, name: str, *, clip_len: int, crop: int, width: float, batch: int, amp: bool) -> None:
        torch.manual_seed(0)
        self.model = build_model(name, num_classes=400, clip_len=clip_len, crop_size=crop, width=width)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-3, momentum=0.9)
        self.x = torch.randn(batch, 3, clip_len, crop, crop)
        self.y = torch.randint(0, 400, (batch,))
        self.amp = amp

    def step(self) -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.amp):
            out = self.model(self.x)
        loss = nn.functional.cross_entropy(out.float(), self.y)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()

    def clips_per_s(self, steps: int) -> float:
        t0 = time.perf_counter()
        for _ in range(steps):
            self.step()
        return steps * self.x.shape[0] / (time.perf_counter() - t0)


def trainer_model(name: str, args: argparse.Namespace) -> nn.Module:
    """``name`` as the benchmark trains it (400 classes, ``--width``), in training mode."""
    torch.manual_seed(0)
    return build_model(name, num_classes=400, clip_len=args.clip_len, crop_size=args.crop, width=args.width).train()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.models", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated registry names (default: all)")
    p.add_argument("--clip-len", type=int, default=16, help="frames per clip (default 16)")
    p.add_argument("--crop", type=int, default=112, help="square crop (default 112)")
    p.add_argument("--width", type=float, default=1.0, help="channel multiplier (default 1.0: the published models)")
    p.add_argument("--batch", type=int, default=2, help="clips per training step (default 2)")
    p.add_argument("--steps", type=int, default=2, help="timed steps per model and round (default 2)")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps per model first (default 1)")
    p.add_argument("--rounds", type=int, default=1, help="interleaved rounds; the best of each row is shown")
    p.add_argument("--amp", choices=("off", "bf16"), default="off", help="CPU autocast (default off)")
    p.add_argument("--threads", type=int, default=None, help="torch math threads (default: torch's choice)")
    args = p.parse_args(argv)
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    unknown = [n for n in names if n not in MODELS]
    if unknown or not names:
        p.error(f"--models: unknown {', '.join(unknown) or 'empty list'} (choose from {', '.join(MODELS)})")
    for flag in ("clip_len", "crop", "batch", "steps", "rounds"):
        if getattr(args, flag) < 1:
            p.error(f"--{flag.replace('_', '-')} must be >= 1")
    if args.width <= 0 or args.warmup < 0:
        p.error("--width must be > 0 and --warmup >= 0")
    too_small = [MODELS[n].input_problem(args.clip_len, args.crop) for n in names]
    if any(too_small):
        p.error("; ".join(t for t in too_small if t))
    if args.threads:
        torch.set_num_threads(args.threads)
    flops = {n: flops_per_clip(n, clip_len=args.clip_len, crop_size=args.crop, width=args.width) for n in names}
    memory = {n: saved_bytes(trainer_model(n, args), torch.randn(1, 3, args.clip_len, args.crop, args.crop))
              for n in names}
    trainers = {n: Trainer(n, clip_len=args.clip_len, crop=args.crop, width=args.width, batch=args.batch,
                           amp=args.amp == "bf16") for n in names}
    for t in trainers.values():
        for _ in range(args.warmup):
            t.step()
    speed: dict[str, float] = {}
    for _ in range(args.rounds):
        for n, t in trainers.items():
            speed[n] = max(speed.get(n, 0.0), t.clips_per_s(args.steps))
    print(f"\n{args.clip_len}x{args.crop}x{args.crop} clips, width {args.width:g}, batch {args.batch}, amp {args.amp}, "
          f"{torch.get_num_threads()} thread(s), {args.steps} timed steps after {args.warmup}, best of {args.rounds} "
          f"round(s)\n")
    print(f"| {'model':11} | {'params (400 classes)':>20} | {'GFLOPs/clip':>11} | {'registry GFLOPs (input)':>27} | "
          f"{'train clips/s':>13} | {'GFLOP/s':>7} | {'saved MiB/clip':>14} |")
    print(f"|{'-' * 13}|{'-' * 22}|{'-' * 13}|{'-' * 29}|{'-' * 15}|{'-' * 9}|{'-' * 16}|")
    for n in names:
        spec = MODELS[n]
        registry = f"{spec.flops / 1e9:.1f} ({spec.clip_len}x{spec.crop_size}²)"
        print(f"| {n:11} | {parameters(n, width=args.width):>20,} | {flops[n] / 1e9:11.4g} | {registry:>27} | "
              f"{speed[n]:13.3f} | {speed[n] * 3 * flops[n] / 1e9:7.1f} | {memory[n] / 2**20:14.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
