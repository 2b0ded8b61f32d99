"""Dataset sources: Kinetics annotation CSV, list file, or a tree of class folders.

Every source becomes a sorted list of ``VideoItem`` plus the class names; entries
that cannot be used (missing file, path escaping the video root, duplicate id)
are returned as ``Problem`` records instead of raising, so a 240k-video job
reports them and goes on.
"""

from __future__ import annotations

import csv
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

VIDEO_EXTENSIONS = frozenset(
    {".mp4", ".webm", ".mkv", ".avi", ".mov", ".m4v", ".flv", ".mpg", ".mpeg", ".ogv", ".3gp", ".ts"}
)
CSV_REQUIRED = ("label", "youtube_id", "time_start", "time_end")


class SourceError(ValueError):
    """The source as a whole is unusable (wrong columns, no videos, unreadable)."""


@dataclass(frozen=True)
class VideoItem:
    """One video to convert: a stable id, where it is, and its class index."""

    id: str
    path: str
    label: int


@dataclass(frozen=True)
class Problem:
    """An entry of the source that was not converted, and why."""

    id: str
    path: str
    status: str  # "missing" | "rejected"
    reason: str


@dataclass
class Source:
    items: list[VideoItem]
    classes: list[str]
    problems: list[Problem] = field(default_factory=list)
    kind: str = ""


def _inside(root: str, rel: str) -> str | None:
    """The absolute path of ``rel`` under ``root``, or None when it escapes it.

    The check is lexical (after normalising ``..``), so symlinks the user placed
    inside the root keep working.
    """
    root_abs = os.path.abspath(root)
    full = os.path.abspath(os.path.join(root_abs, rel))
    if full != root_abs and full.startswith(root_abs.rstrip(os.sep) + os.sep):
        return full
    return None


def _read_classes(path: str | None) -> list[str] | None:
    if path is None:
        return None
    names = [line.strip() for line in Path(path).read_text().splitlines() if line.strip()]
    if len(set(names)) != len(names):
        raise SourceError(f"{path}: class names repeat")
    return names


def _index_tree(root: str) -> dict[str, str]:
    """Map each video file's stem to its path, walking ``root`` once."""
    index: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            stem, ext = os.path.splitext(name)
            if ext.lower() in VIDEO_EXTENSIONS:
                index.setdefault(stem, os.path.join(dirpath, name))
    return index


def _finish(kind: str, entries: list[tuple[str, str, str]], classes: list[str] | None,
            problems: list[Problem], numeric: bool = False) -> Source:
    """Turn (id, path, label name) entries into sorted items with class indices."""
    if classes is None:
        if numeric:
            top = max((int(lab) for _, _, lab in entries), default=-1)
            classes = [str(i) for i in range(top + 1)]
        else:
            classes = sorted({lab for _, _, lab in entries})
    lookup = {name: i for i, name in enumerate(classes)}
    items: list[VideoItem] = []
    seen: set[str] = set()
    for vid, path, lab in entries:
        if numeric and lab.isdigit() and int(lab) < len(classes):
            label = int(lab)
        elif lab in lookup:
            label = lookup[lab]
        else:
            problems.append(Problem(vid, path, "rejected", f"label {lab!r} is not one of the {len(classes)} classes"))
            continue
        if vid in seen:
            problems.append(Problem(vid, path, "rejected", "duplicate video id"))
            continue
        seen.add(vid)
        items.append(VideoItem(vid, path, label))
    items.sort(key=lambda it: it.id)
    return Source(items, classes, problems, kind)


def _csv_times(row: dict[str, str]) -> tuple[int, int]:
    """The whole seconds that name a Kinetics clip file; ValueError says why a row has none."""
    times = []
    for col in ("time_start", "time_end"):
        text = row[col]
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"{col} {text!r} is not a number") from None
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{col} {text!r} is not a finite number of seconds >= 0")
        times.append(int(value))
    if times[1] < times[0]:
        raise ValueError(f"time_end {row['time_end']!r} is before time_start {row['time_start']!r}")
    return times[0], times[1]


def from_csv(csv_path: str, videos: str, *, split: str | None = None, classes_file: str | None = None) -> Source:
    """Kinetics annotations; files found flat or in class folders under ``videos``."""
    if not os.path.isdir(videos):
        raise SourceError(f"{videos}: --videos is not a directory")
    with open(csv_path, newline="") as fh:
        reader = csv.DictReader(fh)
        try:
            columns = [c.strip() for c in (reader.fieldnames or [])]
            missing_cols = [c for c in CSV_REQUIRED if c not in columns]
            if missing_cols:
                raise SourceError(
                    f"{csv_path}: CSV lacks column(s) {', '.join(missing_cols)}; "
                    f"needs {','.join(CSV_REQUIRED)}[,split][,is_cc], has {','.join(columns) or 'none'}"
                )
            # reader.line_num after a row is the file line it ended on (blank lines are skipped).
            rows = [(reader.line_num, {k.strip(): (v or "").strip() for k, v in row.items() if k is not None})
                    for row in reader]
        except csv.Error as exc:
            raise SourceError(f"{csv_path}: not readable as CSV after line {reader.line_num}: {exc}") from None
    index = _index_tree(videos)
    entries, problems = [], []
    for n, row in rows:
        if split is not None and row.get("split", "") != split:
            continue
        yid = row["youtube_id"]
        try:
            start, end = _csv_times(row)
        except ValueError as exc:
            problems.append(Problem(yid, csv_path, "rejected", f"line {n}: {exc}"))
            continue
        stem = f"{yid}_{start:06d}_{end:06d}"
        if not row["label"]:
            problems.append(Problem(stem, csv_path, "rejected", f"line {n}: no label"))
            continue
        if not yid or "/" in yid or "\\" in yid or yid.startswith("."):
            problems.append(Problem(stem, csv_path, "rejected",
                                    f"line {n}: youtube_id {yid!r} would leave the video root"))
            continue
        path = index.get(stem)
        if path is None:
            problems.append(Problem(stem, os.path.join(videos, stem + ".mp4"), "missing",
                                    "no video file with this name under the video root"))
            continue
        entries.append((stem, path, row["label"]))
    if not entries and not problems:
        raise SourceError(f"{csv_path}: no rows" + (f" with split {split!r}" if split else ""))
    classes = _read_classes(classes_file)
    if classes is None:
        # Every row, whatever its split or state: the train and val conversions of
        # one CSV then share one class list even when a split lacks a class.
        classes = sorted({row["label"] for _, row in rows if row["label"]})
    return _finish("csv", entries, classes, problems)


def from_list(list_path: str, videos: str | None = None, *, classes_file: str | None = None) -> Source:
    """mmaction2 list file: ``relative/path label`` per line, label an index or a name."""
    root = videos or os.path.dirname(os.path.abspath(list_path))
    entries, problems = [], []
    numeric = True
    with open(list_path) as fh:
        for n, line in enumerate(fh, start=1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.rsplit(maxsplit=1)
            if len(parts) != 2:
                problems.append(Problem(line, list_path, "rejected", f"line {n}: expected 'path label'"))
                continue
            rel, lab = parts
            vid = os.path.splitext(rel)[0].lstrip("/")
            full = _inside(root, rel)
            if full is None:
                problems.append(Problem(vid, rel, "rejected", f"line {n}: path escapes the video root {root}"))
                continue
            if not os.path.isfile(full):
                problems.append(Problem(vid, full, "missing", "file not found"))
                continue
            numeric = numeric and lab.isdigit()
            entries.append((os.path.splitext(os.path.relpath(full, root))[0], full, lab))
    if not entries and not problems:
        raise SourceError(f"{list_path}: no entries")
    return _finish("list", entries, _read_classes(classes_file), problems, numeric=numeric)


def from_folders(root: str, *, classes_file: str | None = None) -> Source:
    """``root/<class>/**/<video>``: the class is the first folder level."""
    entries = []
    for cls in sorted(os.listdir(root)):
        cdir = os.path.join(root, cls)
        if not os.path.isdir(cdir):
            continue
        for dirpath, dirnames, filenames in os.walk(cdir):
            dirnames.sort()
            for name in sorted(filenames):
                if os.path.splitext(name)[1].lower() in VIDEO_EXTENSIONS:
                    full = os.path.join(dirpath, name)
                    entries.append((os.path.splitext(os.path.relpath(full, root))[0], full, cls))
    if not entries:
        raise SourceError(f"{root}: no video files in class folders (expected {root}/<class>/<video>.mp4)")
    return _finish("folders", entries, _read_classes(classes_file), [])


def load_source(src: str, *, videos: str | None = None, split: str | None = None,
                classes_file: str | None = None) -> Source:
    """Pick the reader by what ``src`` is: a folder, a ``.csv`` file, or a list file."""
    if not os.path.exists(src):
        raise SourceError(f"{src}: no such file or directory")
    if os.path.isdir(src):
        return from_folders(src, classes_file=classes_file)
    if src.lower().endswith(".csv"):
        if videos is None:
            raise SourceError(f"{src}: a CSV source needs --videos DIR (where the video files are)")
        return from_csv(src, videos, split=split, classes_file=classes_file)
    return from_list(src, videos, classes_file=classes_file)
