"""Loading another run's weights into a model of the registry (``--finetune``), the classifier aside."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn


def strip_prefixes(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Drop the ``module.`` (DDP) and ``_orig_mod.`` (torch.compile) prefixes from keys."""
    out = {}
    for key, value in state.items():
        for prefix in ("module.", "_orig_mod."):
            while key.startswith(prefix):
                key = key[len(prefix):]
        out[key] = value
    return out


def reset_classifier(model: nn.Module, classifier: str) -> None:
    """The linear layer under ``classifier`` (a parameter prefix such as ``fc.``) to a fresh N(0, 0.01), zero bias."""
    head = model.get_submodule(classifier.rstrip("."))
    if not isinstance(head, nn.Linear):
        raise ValueError(f"{classifier.rstrip('.')} is a {type(head).__name__}, not the linear classifier")
    head.reset_parameters()  # as before the registry: same draws, so the same fine-tuning start for C3D
    nn.init.normal_(head.weight, std=0.01)
    nn.init.zeros_(head.bias)


def load_for_finetuning(model: nn.Module, state: Mapping[str, torch.Tensor], *, classifier: str) -> list[str]:
    """Load every layer but a classifier of another shape; returns the keys left at their init.

    ``classifier`` is the classifier's parameter prefix (``ModelSpec.classifier``:
    ``fc8.`` for C3D, ``fc.`` for the ResNets). It is kept when its shape
    matches and re-initialised otherwise, so a Kinetics checkpoint fine-tunes
    on a 101-class dataset. Any other missing or mismatched layer is an
    error: loading half a backbone silently would train from a random start
    without saying so.
    """
    state = strip_prefixes(state)
    own = model.state_dict()
    skipped = []
    usable = {}
    for key, value in state.items():
        if key.startswith(classifier) and (key not in own or own[key].shape != value.shape):
            skipped.append(key)
            continue
        usable[key] = value
    problems = []
    for key, value in usable.items():
        if key not in own:
            problems.append(f"unexpected layer {key}")
        elif own[key].shape != value.shape:
            problems.append(f"{key}: checkpoint {tuple(value.shape)} vs model {tuple(own[key].shape)}")
    missing = [k for k in own if k not in usable and not k.startswith(classifier)]
    problems += [f"missing layer {k}" for k in missing]
    if problems:
        raise ValueError("checkpoint does not fit this model (same --model/--model-width/--bn/crop?): "
                         + "; ".join(problems[:5]) + (" ..." if len(problems) > 5 else ""))
    model.load_state_dict(usable, strict=False)
    if skipped:
        reset_classifier(model, classifier)
    return sorted(k for k in own if k not in usable)


__all__ = ["load_for_finetuning", "reset_classifier", "strip_prefixes"]
