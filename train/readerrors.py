"""The readers' errors as one-line ``TrainError``s naming what to do.

``reader_errors`` wraps building a loader (a crop that does not fit, a bad
seed...); ``reading`` wraps reading batches from it, where a damaged clip or a
DataLoader worker killed by a signal arrives as torch's multi-line traceback
text, which is reduced here to one line.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
from collections.abc import Callable, Iterator

from convert.store.remote import RemoteError
from loaders import FormatError

from .errors import TrainError

_WORKER_DIED = re.compile(r"DataLoader worker \(pid\(?s?\)? ([\d, ]+)\) (?:is killed by signal: ([^.]+)|exited)")


@contextlib.contextmanager
def reader_errors(flag: str, root: str) -> Iterator[None]:
    """The readers' ValueError / FormatError (a crop that does not fit, a bad seed...) as one-line TrainErrors."""
    try:
        yield
    except (ValueError, FormatError) as exc:
        raise TrainError(f"{flag} {root}: {exc}") from exc
    except RemoteError as exc:  # its message names the URL and the reason
        raise TrainError(f"{flag}: {exc}") from exc


def _original_message(exc: BaseException) -> str:
    """The one-line message of ``exc``; for an error a DataLoader worker raised (re-raised here with the
    worker's whole traceback as its text), the original error's message, its last line."""
    text = str(exc).strip()
    if "Original Traceback" in text:
        last = text.splitlines()[-1]
        return re.sub(r"^[\w.]*(?:Error|Exception): ", "", last)
    return " ".join(text.split())


def _worker_death(exc: RuntimeError) -> tuple[str, str | None] | None:
    """(pids, signal name such as SIGBUS or None) when ``exc`` says a DataLoader worker process died."""
    pids, sig = None, None
    seen: BaseException | None = exc
    while seen is not None:  # torch raises "exited unexpectedly" from the "killed by signal" error
        m = _WORKER_DIED.search(str(seen))
        if m:
            pids = pids or m.group(1).strip()
            if m.group(2) and sig is None:
                desc = m.group(2).strip()
                sig = next((s.name for s in signal.Signals if signal.strsignal(s) == desc), desc)
        seen = seen.__cause__ or seen.__context__
    return None if pids is None else (pids, sig)


def _stopped(step: Callable[[], int] | None, last: Callable[[], str | None] | None) -> str:
    """What a store that stopped answering left behind: a training run's step and its newest intact checkpoint
    (``last`` gives None when none has been written yet), or, outside a training run, nothing to resume."""
    if step is None:  # python -m train eval: no run, no checkpoint of its own
        return "rerun once the store answers"
    newest = last() if last is not None else None
    if newest is None:
        # Saying "its last checkpoint is intact" here would send the user looking for a file that is not there.
        return (f"the run stopped at step {step()} (no checkpoint has been written yet: rerun with --resume once "
                f"the store answers, it starts from the beginning)")
    return (f"the run stopped at step {step()} (its last checkpoint, {os.path.basename(newest)}, is intact: "
            f"--resume continues once the store answers)")


@contextlib.contextmanager
def reading(flag: str, root: str, step: Callable[[], int] | None = None,
            last: Callable[[], str | None] | None = None) -> Iterator[None]:
    """Errors of the readers while batches are read, as one-line TrainErrors naming what to do.

    A damaged clip (a CRC mismatch with ``--verify-data``, a label outside the
    classes, an undecodable payload) names its shard and clip; a DataLoader
    worker process killed by a signal (SIGBUS from a damaged LMDB page or a
    full /dev/shm, SIGSEGV) is named with the signal instead of torch's
    traceback, which blames shared memory alone. A training run passes
    ``step`` (the step it reached) and ``last`` (its newest intact
    checkpoint, None before the first), which a store that stops answering
    names.
    """
    verify = f"python -m convert verify {root} checks the shards for damage"
    try:
        yield
    except RemoteError as exc:
        # A URL that stayed unreachable through the retries, or refuses us: the run stops at the step it reached,
        # its checkpoints untouched, and --resume continues once the store answers again.
        raise TrainError(f"{flag}: {_original_message(exc)}; {_stopped(step, last)}") from exc
    except FormatError as exc:
        raise TrainError(f"{flag} {root}: {_original_message(exc)} ({verify})") from exc
    except RuntimeError as exc:
        died = _worker_death(exc)
        if died is None:
            raise
        pids, sig = died
        how = f"was killed by {sig}" if sig else "exited unexpectedly"
        raise TrainError(f"a loader worker process (pid {pids}) {how} while reading {flag} {root}: {verify}; "
                         f"the other usual cause is a too-small /dev/shm (docker run --shm-size 8g; or use "
                         f"--loader threads, which needs none)") from exc
