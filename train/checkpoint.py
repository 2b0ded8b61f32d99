"""Checkpoints that survive a kill at any moment and resume bit-for-bit.

A checkpoint is one ``torch.save`` of plain containers and tensors (so it
loads with ``weights_only=True``): model, optimizer, GradScaler and scheduler
state, the global step and epoch, the sampler's position, every RNG state
(Python, NumPy, torch CPU and CUDA), the class names and the run's
``TrainConfig`` as a dict (``config``; ``saved_config`` reads it back). It is
written to a temporary file in the same folder, flushed to disk and renamed,
so a reader sees the old checkpoint or the new one, never a half-written file.

Files in OUT: ``checkpoint_step<N>.pt`` for the last ``--keep-last`` saves,
``checkpoint.pt`` (the newest of them) and ``checkpoint_best.pt`` (the one
with the best validation video top-1 so far). The last two are hard links to
a step file (a copy where the filesystem has no hard links), so they cost no
space or write time. ``--resume`` takes the newest step file that loads,
falling back to an older one when the newest is damaged.
"""

from __future__ import annotations

import os
import pickle
import random
import re
import shutil
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from .config import TrainConfig
from .errors import TrainError
from .options import flag

LATEST = "checkpoint.pt"


def rng_state() -> dict[str, Any]:
    """All RNG states as tensors and numbers."""
    version, mt, gauss = random.getstate()
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state(legacy=True)
    np_keys = np.asarray(np_keys)
    state: dict[str, Any] = {
        "python": {"version": version, "state": torch.tensor(mt, dtype=torch.int64), "gauss": gauss},
        "numpy": {"name": np_name, "keys": torch.from_numpy(np_keys.astype(np.int64)), "pos": int(np_pos),
                  "has_gauss": int(np_has_gauss), "gauss": float(np_gauss)},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Undo ``rng_state``: the next random draw of every generator is the one the saver would have made."""
    py = state["python"]
    random.setstate((py["version"], tuple(int(v) for v in py["state"].tolist()), py["gauss"]))
    npst = state["numpy"]
    np.random.set_state((npst["name"], npst["keys"].numpy().astype(np.uint32), npst["pos"], npst["has_gauss"],
                         npst["gauss"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        cuda = state["cuda"]
        if len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)


BEST = "checkpoint_best.pt"
STEP_FILE = re.compile(r"^checkpoint_step(\d+)\.pt$")


def latest_path(out: str) -> str:
    return os.path.join(out, LATEST)


def best_path(out: str) -> str:
    return os.path.join(out, BEST)


def step_path(out: str, step: int) -> str:
    return os.path.join(out, f"checkpoint_step{step:09d}.pt")


def step_files(out: str) -> list[tuple[int, str]]:
    """(step, path) of every ``checkpoint_step<N>.pt`` in ``out``, oldest first."""
    if not os.path.isdir(out):
        return []
    found = [(int(m.group(1)), os.path.join(out, name)) for name in os.listdir(out)
             if (m := STEP_FILE.match(name))]
    return sorted(found)


def _fsync_dir(folder: str) -> None:
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def link_atomic(src: str, dst: str) -> str:
    """Make ``dst`` name the same file as ``src`` (a hard link, else a copy), replacing ``dst`` atomically."""
    folder = os.path.dirname(os.path.abspath(dst))
    tmp = os.path.join(folder, f".{os.path.basename(dst)}.tmp.{os.getpid()}")
    try:
        try:
            os.link(src, tmp)
        except OSError:  # a filesystem without hard links
            shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    _fsync_dir(folder)
    return dst


def save_checkpoint(obj: dict[str, Any], out: str, step: int, keep_last: int) -> str:
    """Save as ``checkpoint_step<step>.pt``, point ``checkpoint.pt`` at it, keep the newest ``keep_last`` step files."""
    if keep_last < 1:
        raise TrainError(f"--keep-last must be at least 1, got {keep_last}")
    path = save_atomic(obj, step_path(out, step))
    link_atomic(path, latest_path(out))
    for _, old in step_files(out)[:-keep_last]:
        os.unlink(old)  # checkpoint_best.pt keeps its own link to the file when it is the best
    return path


def newest_complete(out: str, say: Callable[[str], None]) -> tuple[str, dict[str, Any]] | None:
    """The newest checkpoint in ``out`` that loads, as (path, contents); None when there is none.

    Step files newest first, then ``checkpoint.pt`` (runs saved before step
    files existed). One that cannot be read is skipped with a one-line note.
    """
    candidates = [p for _, p in reversed(step_files(out))]
    if os.path.isfile(latest_path(out)):
        candidates.append(latest_path(out))
    for k, path in enumerate(candidates):
        try:
            return path, load(path)
        except TrainError as exc:
            left = "trying the previous one" if k + 1 < len(candidates) else "no older checkpoint left"
            say(f"note: {exc}; {left}")
    if candidates:
        raise TrainError(f"--resume: no checkpoint in {out} can be read (see the notes above); pass --overwrite "
                         f"to start again")
    return None


def remove_run(out: str) -> list[str]:
    """``--overwrite``: delete a run's checkpoints (step files, latest, best); returns their names."""
    names = [os.path.basename(p) for _, p in step_files(out)]
    names += [n for n in (LATEST, BEST) if os.path.isfile(os.path.join(out, n))]
    for name in names:
        os.unlink(os.path.join(out, name))
    return names


def save_atomic(obj: dict[str, Any], path: str) -> str:
    """``torch.save`` to a temporary name beside ``path``, fsync, then rename over it."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f".{os.path.basename(path)}.tmp.{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    _fsync_dir(folder)  # make the rename itself durable
    return path


def describe_run(out: str) -> str:
    """What of a training run ``out`` holds ("" when none): "checkpoints", or its metrics log."""
    if os.path.isfile(latest_path(out)) or step_files(out):
        return "checkpoints"
    metrics = os.path.join(out, "metrics.jsonl")
    if os.path.isfile(metrics) and os.path.getsize(metrics) > 0:
        return "metrics.jsonl"
    return ""


def remove_stale_temps(out: str) -> list[str]:
    """Delete temporary files a killed save left behind in ``out``; returns their names."""
    if not os.path.isdir(out):
        return []
    stale = [f for f in os.listdir(out) if f.startswith(".checkpoint") and ".pt.tmp." in f]
    for name in stale:
        os.unlink(os.path.join(out, name))
    return stale


def load(path: str) -> dict[str, Any]:
    """A checkpoint as saved, tensors on the CPU; one-line error if it is missing or unreadable."""
    if not os.path.isfile(path):
        raise TrainError(f"checkpoint {path} not found")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:  # holds more than tensors and plain containers
        raise TrainError(f"checkpoint {path} holds objects weights_only loading refuses: {exc}") from exc
    except (RuntimeError, EOFError, OSError, ValueError) as exc:
        raise TrainError(f"checkpoint {path} cannot be read: {exc}") from exc


def model_state(ckpt: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The model weights of a trainer checkpoint, or the file itself if it is a bare state dict."""
    state = ckpt.get("model", ckpt)
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise TrainError("checkpoint holds no model state dict")
    return state


CLASSES_HINT = ("convert every split with one class list: python -m convert SRC OUT --classes FILE "
                "(one class name per line)")
# Settings that decide the shapes of the model's weights or of the optimizer's
# state: a checkpoint saved with other values cannot be loaded into this run.
SHAPE_SETTINGS = ("model_width", "bn", "crop_size", "downsample", "clip_len", "optimizer")


def check_classes(ckpt: dict[str, Any], classes: list[str], path: str) -> None:
    """A resumed run must train on the classes the checkpoint was trained on, in the same order."""
    saved = ckpt.get("classes")
    if saved is None:
        return
    if len(saved) != len(classes):
        raise TrainError(f"checkpoint {path} was trained on {len(saved)} classes, --data has {len(classes)} "
                         f"(use --finetune to start a new classifier, or {CLASSES_HINT})")
    if list(saved) != list(classes):
        raise TrainError(f"checkpoint {path} has the same number of classes as --data but other names or order "
                         f"({CLASSES_HINT})")


def saved_config(ckpt: dict[str, Any], path: str) -> TrainConfig:
    """The ``TrainConfig`` a trainer checkpoint was saved with; one-line error when it holds none."""
    raw = ckpt.get("config")
    if raw is None:
        if isinstance(ckpt.get("args"), dict):
            raise TrainError(f"checkpoint {path} comes from an older python -m train (its settings are saved as "
                             f"'args', without a 'config'): continue it with the trainer that wrote it, or start a "
                             f"new run from its weights with --finetune {path}")
        raise TrainError(f"checkpoint {path} holds no training config (not written by python -m train)")
    try:
        return TrainConfig.from_dict(raw)
    except TrainError as exc:
        raise TrainError(f"checkpoint {path}: {exc}") from exc


def check_settings(ckpt: dict[str, Any], cfg: TrainConfig, path: str) -> TrainConfig:
    """The checkpoint's config; one-line error naming every shape-deciding setting that differs from ``cfg``."""
    saved = saved_config(ckpt, path)
    differ = [f"{flag(k)} {getattr(saved, k)} (this run: {getattr(cfg, k)})" for k in SHAPE_SETTINGS
              if getattr(saved, k) != getattr(cfg, k)]
    if differ:
        raise TrainError(f"checkpoint {path} was saved with " + ", ".join(differ)
                         + ": pass the checkpoint's values to resume, or another --out to start a new run")
    return saved
