"""The job's progress: the shards' progress files polled and drawn as one tqdm bar on a terminal, or said as a
line at a fixed interval where there is none.

Written to a file or a pipe (a batch job's log, a container's, ``| tee``),
a conversion would otherwise print nothing until it ends, which for a large
dataset is hours and reads as a hang. Then a line every ``interval`` seconds
(as the trainer's ``train/heartbeat.py`` does) says the videos done of the
total, the clips converted by this run, their rate and the time left.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import threading
import time
from collections import Counter
from typing import TextIO

from ..format import PROGRESS_DIR
from ..format.units import duration

# Seconds between two progress lines: often enough that a log shows the job is alive, rarely enough that a
# long job's log stays readable.
PROGRESS_LINE_S = 60.0
# Another interval, in seconds, for the lines (tests set it to see lines within a short job).
INTERVAL_ENV = "CONVERT_PROGRESS_INTERVAL"
MAX_INTERVAL = 7 * 24 * 3600.0


def line_interval() -> float:
    """The seconds between progress lines: ``$CONVERT_PROGRESS_INTERVAL``, else ``PROGRESS_LINE_S``; ValueError
    in one line naming the variable when it is not a number of seconds above 0, at most a week."""
    text = os.environ.get(INTERVAL_ENV, "").strip()
    if not text:
        return PROGRESS_LINE_S
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (0 < value <= MAX_INTERVAL):  # nan and inf fail here too
        raise ValueError(f"{INTERVAL_ENV}={text!r}: the seconds between progress lines must be a number above 0, "
                         f"at most {MAX_INTERVAL:g}")
    return value


def progress_line(state: dict, total: int, elapsed: float) -> str:
    """``progress: 37 of 200 videos, 512 clips, 8.5 clips/s, about 4 min 10 s left``.

    ``state``: the shards' progress files summed (``done`` videos, this run's
    ``new`` videos and ``clips``); ``elapsed``: seconds since the job started.
    ``done`` counts the videos an interrupted run already converted too, the
    clips and the rates only this run's, so the time left is this run's pace
    applied to what is left.
    """
    done = min(int(state.get("done", 0)), total)
    clips, new = int(state.get("clips", 0)), int(state.get("new", 0))
    elapsed = max(elapsed, 1e-9)
    text = f"progress: {done} of {total} videos, {clips} clips, {clips / elapsed:.1f} clips/s"
    if done >= total:
        return text + ", finishing"
    if new > 0:
        return text + f", about {duration((total - done) * elapsed / new)} left"
    return text + ", time left not known yet"


class ProgressBar(threading.Thread):
    """Polls the shards' progress files: drives one tqdm bar in the parent when ``enabled``, else, with
    ``every`` seconds, prints ``progress_line`` to ``stream`` (default stderr) at that interval.

    ``shards``: the names of the shards this run converts (None: every
    shard). Their progress files from an earlier run are removed first, so
    the clips and rates counted are this run's.
    """

    def __init__(self, out: str, total: int, enabled: bool, shards: set[str] | None = None, *,
                 every: float | None = None, stream: TextIO | None = None) -> None:
        super().__init__(daemon=True)
        self.dir = os.path.join(out, PROGRESS_DIR)
        self.total, self.enabled, self.every, self.stream = total, enabled, every, stream
        self.shards = shards  # None: every shard's file; else only these shards run now
        self.stop = threading.Event()
        if enabled or every:
            self._forget_earlier_runs()

    def _names(self) -> list[str]:
        try:
            names = os.listdir(self.dir)
        except OSError:
            return []
        return [n for n in names if n.endswith(".json") and (self.shards is None or n[:-5] in self.shards)]

    def _forget_earlier_runs(self) -> None:
        # What a killed run left: its clips would be counted as this run's. Only a display is lost when a file
        # cannot be removed, so that is no error.
        for name in self._names():
            with contextlib.suppress(OSError):
                os.remove(os.path.join(self.dir, name))

    def _read(self) -> Counter:
        agg: Counter = Counter()
        for name in self._names():
            with contextlib.suppress(OSError, ValueError), open(os.path.join(self.dir, name)) as fh:
                agg.update(json.load(fh))
        return agg

    def run(self) -> None:
        if self.enabled:
            self._bar()
        elif self.every:
            self._lines(self.every)

    def _lines(self, every: float) -> None:
        start = time.monotonic()
        while not self.stop.wait(every):
            line = progress_line(self._read(), self.total, time.monotonic() - start)
            print(line, file=self.stream or sys.stderr, flush=True)

    def _bar(self) -> None:
        from tqdm import tqdm

        start = time.monotonic()
        with tqdm(total=self.total, unit="video", dynamic_ncols=True) as bar:
            while True:
                stopping = self.stop.wait(0.5)
                state = self._read()
                bar.n = min(state.get("done", 0), self.total)
                rate = state.get("clips", 0) / max(time.monotonic() - start, 1e-9)
                bar.set_postfix_str(f"{state.get('clips', 0)} clips, {rate:.1f} clips/s", refresh=False)
                bar.refresh()
                if stopping:
                    return


__all__ = ["INTERVAL_ENV", "PROGRESS_LINE_S", "ProgressBar", "duration", "line_interval", "progress_line"]
