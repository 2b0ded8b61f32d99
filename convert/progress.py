"""The job's progress bar: the shards' progress files polled and drawn as one tqdm bar."""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections import Counter

from .format import PROGRESS_DIR


class ProgressBar(threading.Thread):
    """Polls the shards' progress files and drives one tqdm bar in the parent."""

    def __init__(self, out: str, total: int, enabled: bool, shards: set[str] | None = None) -> None:
        super().__init__(daemon=True)
        self.dir = os.path.join(out, PROGRESS_DIR)
        self.total, self.enabled = total, enabled
        self.shards = shards  # None: every shard's file; else only these shards run now
        self.stop = threading.Event()

    def _read(self) -> dict:
        agg: Counter = Counter()
        if os.path.isdir(self.dir):
            for name in os.listdir(self.dir):
                if name.endswith(".json") and (self.shards is None or name[:-5] in self.shards):
                    with contextlib.suppress(OSError, ValueError), open(os.path.join(self.dir, name)) as fh:
                        agg.update(json.load(fh))
        return agg

    def run(self) -> None:
        if not self.enabled:
            return
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


__all__ = ["ProgressBar"]
