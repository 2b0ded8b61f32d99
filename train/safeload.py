"""Reading a file of weights without running code: ``load_weights_only``, for checkpoints and 2-D weights alike."""

from __future__ import annotations

import os
import pickle
import re
from typing import Any

import torch

_REFUSED_GLOBAL = re.compile(r"GLOBAL ([\w.]+)")
WHY = "a file of weights holds tensors and plain values only; one that needs more may run code when loaded"


def load_weights_only(path: str | os.PathLike[str]) -> Any:
    """``torch.load(path, weights_only=True)`` onto the CPU; a one-line ValueError saying why otherwise.

    The message does not name the file (the caller does). torch's own message
    on a refused file is a paragraph on how to load it anyway, which would run
    its code: not passed on; the object refused is named where torch names it
    (a GLOBAL of pickle protocol 2).
    """
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        named = _REFUSED_GLOBAL.search(str(exc))
        if named:
            raise ValueError(f"holds the Python object {named.group(1)}, which loading with weights_only=True "
                             f"refuses ({WHY})") from exc
        raise ValueError(f"is not a torch.save file of tensors: loading with weights_only=True refuses it "
                         f"({WHY})") from exc
    except (RuntimeError, EOFError, OSError, ValueError) as exc:
        first = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        raise ValueError(f"cannot be read: {first}") from exc


__all__ = ["load_weights_only"]
