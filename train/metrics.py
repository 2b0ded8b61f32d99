"""Evaluation numbers (clip and video level) and the run's logs (JSON lines, TensorBoard).

Evaluation is accumulated per rank into small sums (per video: summed softmax
and summed logits over its clips), gathered with ``all_gather_object`` and
merged, so each rank ships O(videos x classes) numbers, not every clip's
logits, and a video whose clips landed on several ranks is still scored once.
"""

from __future__ import annotations

import json
import os
import resource
from typing import Any

import numpy as np
import torch

from .runfiles import METRICS, TENSORBOARD


class EvalAccumulator:
    """Sums over the clips one rank evaluated."""

    def __init__(self, num_classes: int) -> None:
        self.c = num_classes
        self.loss_sum = 0.0
        self.clips = 0
        self.top1 = 0
        self.top5 = 0
        self.class_correct = np.zeros(num_classes, np.int64)
        self.class_total = np.zeros(num_classes, np.int64)
        self.videos: dict[str, dict[str, Any]] = {}

    def add(self, logits: torch.Tensor, labels: torch.Tensor, video_ids: list[str], loss_sum: float,
            features: dict[str, torch.Tensor] | None = None) -> None:
        """One batch of views; ``features`` (name -> (N, F)) are summed per video too, in float32."""
        feats = {k: v.detach().float().cpu().numpy() for k, v in (features or {}).items()}
        logits = logits.detach().float().cpu()
        labels = labels.cpu()
        k = min(5, self.c)
        top = logits.topk(k, dim=1).indices
        hit1 = top[:, 0] == labels
        self.top1 += int(hit1.sum())
        self.top5 += int((top == labels[:, None]).any(dim=1).sum())
        self.clips += len(labels)
        self.loss_sum += loss_sum
        np.add.at(self.class_total, labels.numpy(), 1)
        np.add.at(self.class_correct, labels[hit1].numpy(), 1)
        probs = torch.softmax(logits, dim=1).double().numpy()
        logs = logits.double().numpy()
        for j, vid in enumerate(video_ids):
            v = self.videos.get(vid)
            if v is None:
                v = self.videos[vid] = {"label": int(labels[j]), "prob": np.zeros(self.c),
                                        "logit": np.zeros(self.c), "n": 0}
                v.update({k: np.zeros(f.shape[1], np.float32) for k, f in feats.items()})
            v["prob"] += probs[j]
            v["logit"] += logs[j]
            v["n"] += 1
            for name, f in feats.items():
                v[name] += f[j]

    def state(self) -> dict[str, Any]:
        """What a rank sends to the others."""
        return {"loss_sum": self.loss_sum, "clips": self.clips, "top1": self.top1, "top5": self.top5,
                "class_correct": self.class_correct, "class_total": self.class_total, "videos": self.videos}


def merge_eval(states: list[dict[str, Any]], classes: list[str], keep_scores: bool = False) -> dict[str, Any]:
    """Clip top-1/top-5, video accuracy (mean softmax and mean logits), per-class accuracy, confusion matrix.

    With ``keep_scores`` the result also holds ``video_scores``: video ids (sorted), labels and mean
    softmax as arrays (for export; ``train.main.save_eval`` leaves them out of the JSON).
    """
    c = len(classes)
    clips = sum(s["clips"] for s in states)
    if clips == 0:
        raise ValueError("evaluation saw no clips")
    videos: dict[str, dict[str, Any]] = {}
    for s in states:
        for vid, v in s["videos"].items():
            have = videos.get(vid)
            if have is None:
                videos[vid] = {k: (x.copy() if isinstance(x, np.ndarray) else x) for k, x in v.items()}
            else:
                for k, x in v.items():
                    if k != "label":
                        have[k] += x
    class_correct = sum(s["class_correct"] for s in states)
    class_total = sum(s["class_total"] for s in states)
    labels = np.array([v["label"] for v in videos.values()], np.int64)
    probs = np.stack([v["prob"] / v["n"] for v in videos.values()])
    logits = np.stack([v["logit"] / v["n"] for v in videos.values()])
    pred = probs.argmax(1)
    pred_logit = logits.argmax(1)
    k = min(5, c)
    top5 = np.argsort(-probs, axis=1)[:, :k]
    confusion = np.zeros((c, c), np.int64)
    np.add.at(confusion, (labels, pred), 1)
    video_total = confusion.sum(1)
    per_class = {}
    for i, name in enumerate(classes):
        per_class[name] = {
            "clip_acc": float(class_correct[i] / class_total[i]) if class_total[i] else None,
            "video_acc": float(confusion[i, i] / video_total[i]) if video_total[i] else None,
            "clips": int(class_total[i]), "videos": int(video_total[i]),
        }
    seen = [v["video_acc"] for v in per_class.values() if v["video_acc"] is not None]
    return {
        "loss": sum(s["loss_sum"] for s in states) / clips,
        "clips": clips,
        "videos": len(videos),
        "clip_top1": sum(s["top1"] for s in states) / clips,
        "clip_top5": sum(s["top5"] for s in states) / clips,
        "video_top1": float((pred == labels).mean()),
        "video_top5": float((top5 == labels[:, None]).any(1).mean()),
        "video_top1_logits": float((pred_logit == labels).mean()),
        "mean_class_video_acc": float(np.mean(seen)) if seen else None,
        "per_class": per_class,
        "classes": list(classes),
        "confusion": confusion.tolist(),
    } | ({"video_scores": _scores(videos)} if keep_scores else {})


SCORES = ("video_ids", "labels", "probs", "views")  # what video_scores holds besides the features
_PER_VIDEO = ("label", "prob", "logit", "n")  # what EvalAccumulator keeps per video besides the features


def _scores(videos: dict[str, dict[str, Any]]) -> dict[str, np.ndarray]:
    """Per video (sorted by id): label, mean softmax, view count, and the mean of each feature collected (the
    model's ``ModelSpec.features``: C3D's fc6 and fc7, the others' pooled features)."""
    ids = sorted(videos)
    out = {"video_ids": np.array(ids), "labels": np.array([videos[v]["label"] for v in ids], np.int64),
           "probs": np.stack([videos[v]["prob"] / videos[v]["n"] for v in ids]),
           "views": np.array([videos[v]["n"] for v in ids], np.int64)}
    for k in sorted(k for k in (videos[ids[0]] if ids else {}) if k not in _PER_VIDEO):
        out[k] = np.stack([videos[v][k] / np.float32(videos[v]["n"]) for v in ids])
    return out


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory so far: CUDA allocator peak on a GPU, the process's max RSS on the CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux reports KiB


class MetricsLog:
    """``OUT/metrics.jsonl`` (one JSON object per line) and TensorBoard if it is installed; rank 0 only."""

    def __init__(self, out: str, enabled: bool, tensorboard: bool = True) -> None:
        self.enabled = enabled
        self.path = os.path.join(out, METRICS)
        self.tb = None
        if enabled and tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # tensorboard is optional
                pass
            else:
                self.tb = SummaryWriter(os.path.join(out, TENSORBOARD))

    def start(self, resumed_step: int | None) -> None:
        """A fresh run empties the log; a resumed one drops lines from after its checkpoint (logged, then killed)."""
        if not self.enabled:
            return
        keep = [] if resumed_step is None else [r for r in read_metrics(self.path) if r.get("step", 0) <= resumed_step]
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            f.writelines(json.dumps(r, default=_jsonable) + "\n" for r in keep)
        os.replace(tmp, self.path)

    def log(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        with open(self.path, "a") as f:
            f.write(json.dumps(record, default=_jsonable) + "\n")
        if self.tb is not None:
            step = int(record.get("step", 0))
            prefix = record.get("kind", "train")
            for key, value in record.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "step":
                    self.tb.add_scalar(f"{prefix}/{key}", value, step)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


def read_metrics(path: str) -> list[dict[str, Any]]:
    """Every record of a metrics.jsonl (a torn last line, from a kill, is skipped)."""
    rows: list[dict[str, Any]] = []
    if not os.path.exists(path):
        return rows
    with open(path) as f:
        for line in f:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")
