"""Checkpoints that survive a kill at any moment and resume bit-for-bit.

A checkpoint is one ``torch.save`` of plain containers and tensors (so it
loads with ``weights_only=True``): model, optimizer, GradScaler and scheduler
state, the global step and epoch, the sampler's position, every RNG state
(Python, NumPy, torch CPU and CUDA) and the class names. It is written to a
temporary file in the same folder, flushed to disk and renamed over
``checkpoint.pt``, so a reader sees the old checkpoint or the new one, never a
half-written file.
"""

from __future__ import annotations

import os
import pickle
import random
from typing import Any

import numpy as np
import torch

from .errors import TrainError

LATEST = "checkpoint.pt"


def rng_state() -> dict[str, Any]:
    """All RNG states as tensors and numbers."""
    version, mt, gauss = random.getstate()
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
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


def latest_path(out: str) -> str:
    return os.path.join(out, LATEST)


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
    # Make the rename itself durable.
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return path


def describe_run(out: str) -> str:
    """What of a training run ``out`` holds ("" when none): its checkpoint's step, or its metrics log."""
    latest = latest_path(out)
    if os.path.isfile(latest):
        return f"{LATEST}"
    metrics = os.path.join(out, "metrics.jsonl")
    if os.path.isfile(metrics) and os.path.getsize(metrics) > 0:
        return "metrics.jsonl"
    return ""


def remove_stale_temps(out: str) -> list[str]:
    """Delete temporary files a killed save left behind in ``out``; returns their names."""
    if not os.path.isdir(out):
        return []
    stale = [f for f in os.listdir(out) if f.startswith(f".{LATEST}.tmp.")]
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


def check_settings(ckpt: dict[str, Any], args: Any, path: str) -> None:
    """One-line error naming every shape-deciding option that differs from the checkpoint's."""
    saved = ckpt.get("args") or {}
    differ = [f"--{k.replace('_', '-')} {saved[k]} (this run: {getattr(args, k)})" for k in SHAPE_SETTINGS
              if k in saved and saved[k] != getattr(args, k)]
    if differ:
        raise TrainError(f"checkpoint {path} was saved with " + ", ".join(differ)
                         + ": pass the checkpoint's values to resume, or another --out to start a new run")
