"""PNG figures: the confusion matrix and the loss/accuracy curves.

matplotlib (a dependency of the package since its figures stay readable at
any class count) draws them; where it is missing anyway, Pillow draws plainer
versions, so a run always leaves its pictures.
"""

from __future__ import annotations

import os
import types
from collections.abc import Sequence
from typing import Any

import numpy as np

from .runfiles import CURVES


def _pyplot() -> types.ModuleType | None:
    """matplotlib.pyplot on the Agg backend, or None without matplotlib."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    return plt


def confusion_png(confusion: Sequence[Sequence[int]], classes: Sequence[str], path: str, *,
                  title: str = "video-level confusion", backend: str = "auto") -> str:
    """Rows are true classes, columns predictions; cells are counts, shaded by row fraction."""
    cm = np.asarray(confusion, dtype=np.int64)
    frac = cm / np.maximum(cm.sum(1, keepdims=True), 1)
    plt = _pyplot() if backend in ("auto", "matplotlib") else None
    if plt is not None:
        n = len(classes)
        size = max(4.0, 0.45 * n + 2)
        fig, ax = plt.subplots(figsize=(size, size))
        ax.imshow(frac, cmap="Blues", vmin=0, vmax=1)
        if n <= 40:  # labels become unreadable beyond that
            ax.set_xticks(range(n), classes, rotation=90, fontsize=8)
            ax.set_yticks(range(n), classes, fontsize=8)
            for i in range(n):
                for j in range(n):
                    if cm[i, j]:
                        ax.text(j, i, str(cm[i, j]), ha="center", va="center", fontsize=7,
                                color="white" if frac[i, j] > 0.5 else "black")
        ax.set_xlabel("predicted")
        ax.set_ylabel("true")
        ax.set_title(title)
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        return path
    from PIL import Image, ImageDraw

    n = len(classes)
    cell = max(8, min(48, 640 // max(n, 1)))
    margin = 120 if n <= 40 else 10
    img = Image.new("RGB", (margin + n * cell + 10, margin + n * cell + 30), "white")
    draw = ImageDraw.Draw(img)
    draw.text((10, 5), title + " (rows: true, columns: predicted)", fill="black")
    for i in range(n):
        if n <= 40:
            draw.text((5, margin + i * cell + cell // 3), classes[i][:18], fill="black")
            draw.text((margin + i * cell + 2, margin - 15 - (i % 2) * 12), classes[i][:6], fill="black")
        for j in range(n):
            shade = int(255 * (1 - frac[i, j]))
            x, y = margin + j * cell, margin + i * cell
            draw.rectangle([x, y, x + cell - 1, y + cell - 1], fill=(shade, shade, 255), outline=(200, 200, 200))
            if cm[i, j] and cell >= 20:
                draw.text((x + 3, y + cell // 3), str(cm[i, j]), fill="black" if shade > 128 else "white")
    img.save(path)
    return path


def _series(rows: list[dict[str, Any]], kind: str, key: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for r in rows:
        if r.get("kind") == kind and isinstance(r.get(key), (int, float)):
            xs.append(float(r["step"]))
            ys.append(float(r[key]))
    return xs, ys


def curves_png(rows: list[dict[str, Any]], path: str, *, backend: str = "auto") -> str:
    """Training loss (left) and evaluation accuracies (right) against the optimizer step."""
    panels = [("training loss", [("train", "loss", "train loss"), ("eval", "loss", "val loss")]),
              ("validation accuracy", [("eval", "clip_top1", "clip top-1"), ("eval", "video_top1", "video top-1")])]
    plt = _pyplot() if backend in ("auto", "matplotlib") else None
    if plt is not None:
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for ax, (title, series) in zip(axes, panels):
            drawn = 0
            for kind, key, label in series:
                xs, ys = _series(rows, kind, key)
                if xs:
                    ax.plot(xs, ys, marker="o" if kind == "eval" else None, markersize=3, label=label)
                    drawn += 1
            ax.set_title(title)
            ax.set_xlabel("optimizer step")
            ax.grid(alpha=0.3)
            if drawn:
                ax.legend()
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        return path
    from PIL import Image, ImageDraw

    w, h, pad = 420, 300, 40
    img = Image.new("RGB", (2 * w, h), "white")
    draw = ImageDraw.Draw(img)
    colours = [(31, 119, 180), (255, 127, 14)]
    for p, (title, series) in enumerate(panels):
        x0 = p * w
        draw.text((x0 + pad, 8), title, fill="black")
        draw.rectangle([x0 + pad, pad, x0 + w - 10, h - pad], outline="black")
        data = [(_series(rows, kind, key), label) for kind, key, label in series]
        allx = [x for (xs, _), _ in data for x in xs]
        ally = [y for (_, ys), _ in data for y in ys]
        if not allx:
            continue
        lo_x, hi_x = min(allx), max(max(allx), min(allx) + 1)
        lo_y, hi_y = min(min(ally), 0.0), max(max(ally), 1e-6)
        draw.text((x0 + 2, pad), f"{hi_y:.2g}", fill="black")
        draw.text((x0 + 2, h - pad - 10), f"{lo_y:.2g}", fill="black")
        draw.text((x0 + w - 60, h - pad + 5), f"step {int(hi_x)}", fill="black")
        for k, ((xs, ys), label) in enumerate(data):
            pts = [(x0 + pad + (x - lo_x) / (hi_x - lo_x) * (w - pad - 10),
                    h - pad - (y - lo_y) / (hi_y - lo_y) * (h - 2 * pad)) for x, y in zip(xs, ys)]
            if len(pts) > 1:
                draw.line(pts, fill=colours[k], width=2)
            for px, py in pts if len(pts) < 50 else []:
                draw.ellipse([px - 2, py - 2, px + 2, py + 2], fill=colours[k])
            draw.text((x0 + pad + 5, pad + 5 + 12 * k), label, fill=colours[k])
    img.save(path)
    return path


def save_figures(out: str, rows: list[dict[str, Any]]) -> str:
    """``OUT/curves.png`` from the metrics log."""
    return curves_png(rows, os.path.join(out, CURVES))
