"""``Heartbeat``: a progress line at a fixed interval where no progress bar is shown.

The tqdm bar is drawn only on a terminal. Written to a file or a pipe (a
batch job's log, ``python -m train demo > log``), a run would otherwise print
nothing between its evaluations, which on a CPU can be many minutes apart and
reads as a hang. A background thread prints one line every ``interval``
seconds: the steps done, the time per step and what is left, the last logged
loss, and what the run is doing now (a step that has taken longer than the
interval is named, so a slow step is told from a stuck one).
"""

from __future__ import annotations

import sys
import threading
import time
from typing import TextIO

from convert.format.units import duration

# Seconds between two progress lines: often enough that a log shows the run is alive, rarely enough that a
# long run's log stays readable.
HEARTBEAT_S = 60.0


class Heartbeat:
    """Prints ``line()`` to ``out`` (default stdout) every ``interval`` seconds (default ``HEARTBEAT_S``) from a
    daemon thread, between ``start()`` and ``stop()`` (or as a context manager).

    The training loop calls ``at_step`` after each optimizer step and
    ``loss`` with each logged loss; ``phase`` names what the run does
    between steps (``"evaluating"``). ``total`` steps end the run; ``epochs``
    and ``steps_per_epoch`` place a step in its epoch.
    """

    def __init__(self, *, total: int, steps_per_epoch: int, epochs: int, step: int = 0,
                 interval: float | None = None, out: TextIO | None = None) -> None:
        interval = HEARTBEAT_S if interval is None else interval
        if not interval > 0:
            raise ValueError(f"interval must be > 0 seconds, got {interval!r}")
        self.interval, self.total, self.steps_per_epoch, self.epochs = interval, total, steps_per_epoch, epochs
        self.out = out
        self._first = step  # the step this process started from (a resumed run's rate counts its own steps)
        self.step = step
        self.epoch = step // max(1, steps_per_epoch)
        self.current = "training"
        self.last_loss: float | None = None
        now = time.monotonic()
        self._started = self._stepped = self._since = now  # start, last step's end, the current phase's start
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    # -- what the loop tells it -------------------------------------------------
    def at_step(self, step: int, epoch: int) -> None:
        """``step`` optimizer steps are done, ``epoch`` is the epoch in progress."""
        self.step, self.epoch, self.current = step, epoch, "training"
        self._stepped = self._since = time.monotonic()

    def loss(self, value: float) -> None:
        self.last_loss = value

    def phase(self, what: str) -> None:
        """What the run is doing now, until the next step (``"evaluating"``, ``"training"``)."""
        self.current, self._since = what, time.monotonic()

    # -- the line -----------------------------------------------------------------
    def line(self) -> str:
        """``progress: step 40 of 304 (epoch 3 of 19), 2.9 s/step, about 12 min 46 s left, loss 1.234; ...``."""
        now = time.monotonic()
        done = self.step - self._first
        text = f"progress: step {self.step} of {self.total} (epoch {min(self.epoch + 1, self.epochs)} of {self.epochs})"
        if done > 0:
            per_step = (self._stepped - self._started) / done
            text += f", {per_step:.3g} s/step, about {duration(per_step * max(0, self.total - self.step))} left"
        if self.last_loss is not None:
            text += f", loss {self.last_loss:.4g}"
        busy = now - self._since
        if self.current != "training":
            text += f"; {self.current} for {duration(busy)}"
        elif busy > self.interval and self.step < self.total:
            text += f"; step {self.step + 1} running for {duration(busy)}"
        return text

    # -- the thread ---------------------------------------------------------------
    def _run(self) -> None:
        while not self._done.wait(self.interval):
            print(self.line(), file=self.out or sys.stdout, flush=True)

    def start(self) -> Heartbeat:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="train-heartbeat", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def __enter__(self) -> Heartbeat:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = ["HEARTBEAT_S", "Heartbeat"]
