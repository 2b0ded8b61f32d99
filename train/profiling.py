"""``--profile STEPS``: a ``torch.profiler`` trace of a few training steps, where TensorBoard finds it.

The trace shows where a step's time goes: the ``loader_wait`` range (the
trainer waiting for its next batch), the host-to-device copy, forward,
backward and optimizer kernels, and on several ranks the all-reduces.
"""

from __future__ import annotations

import glob
import os

import torch
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

from .runfiles import PROFILE

# Steps skipped before recording: the first pays for start-up (loader threads,
# allocator, cuDNN autotuning), the second warms the profiler itself up.
SKIP, WARMUP = 1, 1


class StepProfiler:
    """Profiles training steps SKIP+WARMUP+1 .. SKIP+WARMUP+``steps`` of this rank into ``OUT/profile/``.

    Call ``step()`` after every optimizer step and ``close()`` at the end
    (which writes the trace even if training stopped before ``steps`` steps
    were recorded). Files: ``OUT/profile/rank<r>.<time>.pt.trace.json``, read
    by TensorBoard's profiler plugin (``tensorboard --logdir OUT/profile``)
    and by Perfetto / chrome://tracing.
    """

    def __init__(self, out: str, steps: int, rank: int, device: torch.device) -> None:
        if steps < 1:
            raise ValueError(f"steps must be >= 1, got {steps}")
        self.dir = os.path.join(out, PROFILE)
        os.makedirs(self.dir, exist_ok=True)
        activities = [ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        self.steps = steps
        self._prof = profile(activities=activities,
                             schedule=schedule(wait=SKIP, warmup=WARMUP, active=steps, repeat=1),
                             on_trace_ready=tensorboard_trace_handler(self.dir, worker_name=f"rank{rank}"))
        self._prof.start()
        self._done = 0
        self._open = True

    def step(self) -> None:
        """One optimizer step is over."""
        if self._open:
            self._prof.step()
            self._done += 1

    def close(self) -> str:
        """Stop, write the trace; returns a line saying where it is (or why there is none)."""
        if not self._open:
            return f"profile: {self.dir}"
        self._open = False
        self._prof.stop()
        recorded = min(max(self._done - SKIP - WARMUP, 0), self.steps)
        traces = sorted(glob.glob(os.path.join(self.dir, "*.pt.trace.json")))
        if not recorded or not traces:
            return (f"profile: training ran {self._done} steps, too few to record any after {SKIP + WARMUP} "
                    f"warm-up steps; no trace written")
        return f"profile: {recorded} steps traced in {self.dir} (tensorboard --logdir {self.dir})"
