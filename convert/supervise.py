"""Run one shard: start its writer process, feed it videos, survive its deaths.

This runs inside a joblib (or Dask) worker and is light: it never decodes or
touches the store. When the shard process dies or hangs on a video, that video
is retried once in a fresh process and then recorded as failed, and the shard
goes on with the next video.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

from .format import LOG_DIR, PROGRESS_DIR, shard_name
from .plan import write_json_atomic

_MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(256 << 20),
               "MALLOC_TOP_PAD_": str(64 << 20)}
_PKG_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass(frozen=True)
class ShardOptions:
    """Per-run knobs that do not change the stored bytes."""

    video_timeout: float = 300.0
    retries: int = 1
    threads: int = 1
    map_size: int | None = None
    compact: bool = False
    part_bytes: int | None = None  # tfrecord: file size at which a shard starts a new file
    max_memory: int | None = None  # bytes of heap per shard process (RLIMIT_DATA)


def describe_exit(rc: int | None) -> str:
    if rc is not None and rc < 0:
        name = signal.Signals(-rc).name
        hint = " (out of memory?)" if -rc == signal.SIGKILL else ""
        return f"decoder process killed by {name}{hint}"
    return f"decoder process exited with status {rc}"


class _Child:
    """The shard process and its line protocol."""

    def __init__(self, out: str, index: int, opts: ShardOptions) -> None:
        os.makedirs(os.path.join(out, LOG_DIR), exist_ok=True)
        log = open(os.path.join(out, LOG_DIR, shard_name(index) + ".log"), "ab")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [_PKG_ROOT, os.environ.get("PYTHONPATH")])))
        # Every clip allocates a few MB (frames, the value, LMDB's overflow
        # pages) and frees them again. glibc would hand such blocks back to the
        # kernel each time and fault fresh zeroed pages in for the next clip;
        # keeping them in the heap measured about 6% more conversion throughput.
        for name, value in _MALLOC_ENV.items():
            env.setdefault(name, value)
        args = {"threads": opts.threads, "map_size": opts.map_size, "compact": opts.compact,
                "part_bytes": opts.part_bytes,
                "max_memory": opts.max_memory}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "convert.shard_worker", out, str(index), json.dumps(args)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, env=env,
        )
        log.close()
        self._buf = b""

    def send(self, obj: dict) -> None:
        self.proc.stdin.write((json.dumps(obj) + "\n").encode())
        self.proc.stdin.flush()

    def read(self, timeout: float | None) -> dict | None:
        """The next answer; None when the process died; TimeoutError when it hangs."""
        fd = self.proc.stdout.fileno()
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buf:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([fd], [], [], wait)
            if not ready:
                raise TimeoutError
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return None
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def kill(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.kill()
        return self.proc.wait()

    def close(self) -> None:
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass


class _Progress:
    """A small JSON file per shard, replaced atomically, that the job's bar polls."""

    def __init__(self, out: str, index: int, total: int) -> None:
        self.path = os.path.join(out, PROGRESS_DIR, shard_name(index) + ".json")
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        self.state = {"total": total, "done": 0, "new": 0, "clips": 0, "frames": 0}
        self._last = 0.0

    def add(self, record: dict | None = None, force: bool = False) -> None:
        if record is not None:
            self.state["done"] += 1
            self.state["new"] += 1
            self.state["clips"] += record.get("clips", 0)
            self.state["frames"] += record.get("frames", 0)
        now = time.monotonic()
        if force or now - self._last > 0.25:
            write_json_atomic(self.path, self.state)
            self._last = now


def run_shard(out: str, index: int, n_items: int, opts: ShardOptions) -> dict:
    """Convert every pending video of shard ``index`` (``n_items`` videos); returns the shard summary.

    The caller passes the count it already has from the plan, so a thousand
    supervisors do not each parse the whole plan again.
    """
    progress = _Progress(out, index, n_items)
    attempts: dict[int, int] = {}

    def start() -> tuple[_Child, dict]:
        child = _Child(out, index, opts)
        hello = child.read(timeout=120)
        if hello is None:
            raise RuntimeError(f"{shard_name(index)}: shard process failed to start: {describe_exit(child.kill())}; "
                               f"see {os.path.join(out, LOG_DIR, shard_name(index) + '.log')}")
        return child, hello

    child, hello = start()
    done = set(hello["done"])
    progress.state["done"] = len(done)
    pending = [i for i in range(n_items) if i not in done]
    pos = 0
    while pos < len(pending):
        i = pending[pos]
        child.send({"op": "video", "index": i})
        try:
            reply = child.read(opts.video_timeout)
            reason = None if reply is not None else describe_exit(child.kill())
        except TimeoutError:
            child.kill()
            reply, reason = None, f"no result within the {opts.video_timeout:g}s per-video timeout (hang?)"
        if reply is not None:
            progress.add(reply)
            pos += 1
            continue
        child.close()
        attempts[i] = attempts.get(i, 0) + 1
        child, _ = start()
        if attempts[i] > opts.retries:
            child.send({"op": "fail", "index": i, "reason": f"{reason}; {attempts[i]} attempts"})
            reply = child.read(timeout=120)
            if reply is None:
                raise RuntimeError(f"{shard_name(index)}: shard process died recording a failure")
            progress.add(reply)
            pos += 1
    child.send({"op": "finish"})
    summary = child.read(timeout=None)
    child.close()
    rc = child.proc.wait()
    if summary is None:
        raise RuntimeError(f"{shard_name(index)}: shard process died while finishing: {describe_exit(rc)}")
    progress.add(force=True)
    summary.pop("finished", None)
    return {"index": index, **summary}
