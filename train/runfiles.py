"""The files a training run writes in its ``--out``, named in one place.

Every writer takes its file's name from here: the checkpoints
(``train.checkpoint``), the metrics log (``train.metrics``), the curves
(``train.plots``), the summary and the evaluations (``train.main``, and
``python -m train eval``, which writes beside the checkpoint it evaluates),
TensorBoard's and the profiler's folders. ``--overwrite`` removes what these
names match (``remove_run``): everything of the previous run, so that none
of it is read as the new run's (its ``curves.png`` and ``summary.json`` were
left beside the new ``metrics.jsonl``), and nothing else. A file of the
user's in the folder stays, and so does a folder that still holds one; a
folder that is a symbolic link (a TensorBoard folder shared by several runs)
is not entered, since the files in it may be other runs'.
"""

from __future__ import annotations

import os
import re

# Checkpoints (train.checkpoint): the step files, the newest one and the best one (links to a step file).
LATEST = "checkpoint.pt"
BEST = "checkpoint_best.pt"
STEP_FILE = re.compile(r"^checkpoint_step(\d+)\.pt$")
# What an atomic write (``train.checkpoint.save_atomic``, ``link_atomic``) renames into place: "." NAME ".tmp." PID.
_CHECKPOINT_TEMP = re.compile(r"^\.checkpoint.*\.pt\.tmp\.\d+$")

METRICS = "metrics.jsonl"  # train.metrics.MetricsLog; rewritten through METRICS + ".tmp"
CURVES = "curves.png"  # train.plots.save_figures
SUMMARY = "summary.json"  # train.main, at the run's end
EVAL = "eval"  # a folder: NAME.json and NAME_confusion.png per evaluation (``eval_files``)
TENSORBOARD = "tb"  # a folder: SummaryWriter's event files
PROFILE = "profile"  # a folder: --profile's traces, "rank<R>.<time>.pt.trace.json"
FINAL_EVAL = "final"  # the evaluation at the run's end


def step_name(step: int) -> str:
    """The file name of step ``step``'s checkpoint."""
    return f"checkpoint_step{step:09d}.pt"


def temp_name(name: str) -> str:
    """The temporary name an atomic write of ``name`` uses in this process (renamed over ``name`` when whole)."""
    return f".{name}.tmp.{os.getpid()}"


def epoch_eval_name(epoch: int) -> str:
    """The evaluation at the end of ``epoch`` (counted from 0, as the stored state counts it)."""
    return f"epoch{epoch:03d}"


def checkpoint_eval_name(data: str, protocol: str, step: int) -> str:
    """``python -m train eval``'s evaluation of step ``step``'s checkpoint on ``data`` (a folder's name)."""
    return f"{data}_{protocol}_step{step}"


def eval_files(out: str, name: str) -> tuple[str, str]:
    """(its results as JSON, its confusion matrix as a PNG): the files of evaluation ``name`` in ``out``."""
    folder = os.path.join(out, EVAL)
    return os.path.join(folder, f"{name}.json"), os.path.join(folder, f"{name}_confusion.png")


# Each folder of a run (relative to --out, "" for --out itself) and the names in it that a run writes.
_WRITTEN: dict[str, re.Pattern[str]] = {
    "": re.compile("|".join([STEP_FILE.pattern, _CHECKPOINT_TEMP.pattern,
                             *(f"^{re.escape(n)}$" for n in (LATEST, BEST, METRICS, METRICS + ".tmp", CURVES,
                                                               SUMMARY))])),
    EVAL: re.compile(r"^(epoch\d+|final|.+_step\d+)(\.json|_confusion\.png)$"),
    TENSORBOARD: re.compile(r"^events\.out\.tfevents\..+$"),
    PROFILE: re.compile(r"^rank\d+\.\d+\.pt\.trace\.json(\.gz)?$"),
}


def run_files(out: str) -> list[str]:
    """The files of a training run in ``out``, as paths relative to it, sorted (none when it is no folder)."""
    found: list[str] = []
    for folder, written in _WRITTEN.items():
        path = os.path.join(out, folder) if folder else out
        if folder and os.path.islink(path):
            continue  # perhaps shared with other runs: not this run's to empty
        try:
            entries = list(os.scandir(path))
        except (FileNotFoundError, NotADirectoryError):
            continue
        found += [os.path.join(folder, e.name) for e in entries
                  if written.match(e.name) and (e.is_file(follow_symlinks=False) or e.is_symlink())]
    return sorted(found)


def remove_run(out: str) -> list[str]:
    """``--overwrite``: delete every file of a training run in ``out`` (``run_files``), then its folders that are
    left empty; returns the files' paths relative to ``out``."""
    names = run_files(out)
    for name in names:
        os.unlink(os.path.join(out, name))
    for folder in _WRITTEN:
        path = os.path.join(out, folder)
        if folder and os.path.isdir(path) and not os.path.islink(path) and not os.listdir(path):
            os.rmdir(path)
    return names


def remove_stale_temps(out: str) -> list[str]:
    """Delete the temporary files a killed checkpoint save left behind in ``out``; returns their names."""
    if not os.path.isdir(out):
        return []
    stale = sorted(name for name in os.listdir(out) if _CHECKPOINT_TEMP.match(name))
    for name in stale:
        os.unlink(os.path.join(out, name))
    return stale
