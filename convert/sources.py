"""Dataset sources: Kinetics annotation CSV, list file, or a tree of class folders.

Every source becomes a sorted list of ``VideoItem`` plus the class names; entries
that cannot be used (missing file, path escaping the video root, duplicate id,
a file that is no regular file, a name that is not UTF-8, a folder that cannot
be read) are returned as ``Problem`` records instead of raising, so a
240k-video job reports them and goes on. What would change the meaning of
every entry (the class list, the labels) stops the job instead, with one line
naming the file and line. Video paths are absolute: what a plan records does
not depend on the working directory of the run that wrote it.
"""

from __future__ import annotations

import csv
import io
import math
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field

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


def read_text(path: str, what: str) -> str:
    """The UTF-8 text of the source file ``path`` (a CSV, a list, a class list); SourceError naming the file,
    and the line of the first byte that is not UTF-8.

    Read whole and decoded at once, so an error can say where: a line
    number, not an offset into a decoder's buffer.
    """
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise SourceError(f"{path}: the {what} is not a regular file")
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise SourceError(f"{path}: cannot read the {what}: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise SourceError(f"{path}: line {line}: not valid UTF-8 ({exc.reason}: byte "
                          f"{data[exc.start:exc.start + 1]!r}); save the {what} as UTF-8") from None


def _read_classes(path: str | None) -> list[str] | None:
    if path is None:
        return None
    names = [line.strip() for line in read_text(path, "class list").splitlines() if line.strip()]
    if len(set(names)) != len(names):
        raise SourceError(f"{path}: class names repeat")
    return names


def shown(path: str) -> str:
    """``path`` as text that can be written anywhere: a name that is not UTF-8 with its bad bytes escaped."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def _undecodable(name: str) -> bool:
    """Whether a name the file system gave holds bytes that are not UTF-8 (surrogate escapes in Python)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def file_problem(path: str) -> tuple[str, str] | None:
    """(status, reason) when ``path`` cannot be a video to convert, None when it is a regular file.

    A FIFO, a socket or a device named like a video would block or never end
    in whatever opens it (a FIFO with no writer hangs ``open``): only regular
    files are ever given to a decoder.
    """
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "missing", "file not found" if not os.path.islink(path) else "broken symbolic link"
    except OSError as exc:
        return "rejected", f"cannot be read: {exc.strerror or exc}"
    if stat.S_ISREG(mode):
        return None
    return "rejected", f"not a regular file ({_kind(mode)}): never opened as a video"


def _walk_videos(root: str, top: str, problems: list[Problem]) -> Iterator[str]:
    """The regular video files under ``top`` (absolute paths), folders and names sorted, at any depth.

    What ``os.walk`` would skip without a word is a ``Problem`` here, named
    by its path relative to ``root``: a folder that cannot be read, a name
    that is not UTF-8 (shown with its bytes escaped), a video-named file that
    is no regular file.
    """
    try:
        with os.scandir(top) as it:
            entries = sorted(it, key=lambda e: e.name)
    except OSError as exc:
        rel = os.path.relpath(top, root)
        problems.append(Problem(shown(rel) + "/", shown(top), "rejected",
                                f"folder cannot be read ({exc.strerror or exc}): the videos in it are not converted"))
        return
    for entry in entries:
        full = os.path.join(top, entry.name)
        try:
            is_dir = entry.is_dir()
        except OSError:
            is_dir = False
        if is_dir:
            if _undecodable(entry.name):
                problems.append(Problem(shown(os.path.relpath(full, root)) + "/", shown(full), "rejected",
                                        "folder name is not valid UTF-8 (shown with its bytes escaped): the "
                                        "videos in it are not converted; rename it"))
                continue
            yield from _walk_videos(root, full, problems)
            continue
        if os.path.splitext(entry.name)[1].lower() not in VIDEO_EXTENSIONS:
            continue
        vid = os.path.splitext(os.path.relpath(full, root))[0]
        if _undecodable(entry.name):
            problems.append(Problem(shown(vid), shown(full), "rejected",
                                    "file name is not valid UTF-8 (shown with its bytes escaped); rename it"))
            continue
        why = file_problem(full)
        if why is not None:
            problems.append(Problem(vid, full, *why))
            continue
        yield full


def _index_tree(root: str) -> tuple[dict[str, str], dict[str, Problem], list[Problem]]:
    """Each video file's stem and path, walking ``root`` once; the stems of files that cannot be used (a
    FIFO...), with their problem; the folders that cannot be read. A file a row does not name is nobody's
    problem: the root may hold other splits."""
    index: dict[str, str] = {}
    found: list[Problem] = []
    for full in _walk_videos(root, root, found):
        index.setdefault(os.path.splitext(os.path.basename(full))[0], full)
    folders = [p for p in found if p.id.endswith("/")]
    unusable = {os.path.basename(p.id): p for p in found if not p.id.endswith("/")}
    return index, unusable, folders


def _is_index(label: str) -> bool:
    """A class number: ASCII digits only (``str.isdigit`` is true for "²", which ``int`` refuses)."""
    return label.isascii() and label.isdigit()


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
        if numeric and _is_index(lab) and int(lab) < len(classes):
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
    csv_path, videos = os.path.abspath(csv_path), os.path.abspath(videos)
    with io.StringIO(read_text(csv_path, "CSV"), newline="") as fh:
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
    index, unusable, problems = _index_tree(videos)
    entries = []
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
        if path is None and stem in unusable:
            problems.append(Problem(stem, unusable[stem].path, unusable[stem].status, unusable[stem].reason))
            continue
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
    """mmaction2 list file: ``relative/path label`` per line, label an index or a name.

    Labels are class numbers or class names, never both: one typo among
    numbers (``v2``) would otherwise turn every label into a name and
    renumber every class. Without ``classes_file`` a mix is refused, naming
    the line of the first label of the rarer kind.
    """
    list_path = os.path.abspath(list_path)
    root = os.path.abspath(videos or os.path.dirname(list_path))
    entries, problems = [], []
    kinds: dict[bool, list[tuple[int, str]]] = {True: [], False: []}  # is a number -> (line, label)
    for n, line in enumerate(read_text(list_path, "list file").splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.rsplit(maxsplit=1)
        if len(parts) != 2:
            problems.append(Problem(line, list_path, "rejected", f"line {n}: expected 'path label'"))
            continue
        rel, lab = parts
        kinds[_is_index(lab)].append((n, lab))
        vid = os.path.splitext(rel)[0].lstrip("/")
        full = _inside(root, rel)
        if full is None:
            problems.append(Problem(vid, rel, "rejected", f"line {n}: path escapes the video root {root}"))
            continue
        why = file_problem(full)
        if why is not None:
            problems.append(Problem(vid, full, *why))
            continue
        entries.append((os.path.splitext(os.path.relpath(full, root))[0], full, lab))
    if not entries and not problems:
        raise SourceError(f"{list_path}: no entries")
    numbers, names = kinds[True], kinds[False]
    if numbers and names and classes_file is None:
        rare, kind = (names, "a name") if len(names) <= len(numbers) else (numbers, "a number")
        n, lab = rare[0]
        raise SourceError(f"{list_path}: line {n}: label {lab!r} is {kind}, but {len(numbers)} labels are class "
                          f"numbers and {len(names)} are names; fix it, or give --classes FILE to read every "
                          f"label as a class name")
    return _finish("list", entries, _read_classes(classes_file), problems, numeric=not names)


def from_folders(root: str, *, classes_file: str | None = None) -> Source:
    """``root/<class>/**/<video>``: the class is the first folder level.

    A class folder that cannot be read, or whose name is not UTF-8, stops the
    job (it would drop a class and renumber the others); anything below it
    that cannot be used is a ``Problem`` (``_walk_videos``).
    """
    root = os.path.abspath(root)
    entries: list[tuple[str, str, str]] = []
    problems: list[Problem] = []
    try:
        with os.scandir(root) as it:
            classes = sorted((e for e in it if e.is_dir()), key=lambda e: e.name)
    except OSError as exc:
        raise SourceError(f"{root}: cannot be read: {exc.strerror or exc}") from None
    for entry in classes:
        cdir = os.path.join(root, entry.name)
        if _undecodable(entry.name):
            raise SourceError(f"{shown(cdir)}: class folder name is not valid UTF-8 (shown with its bytes "
                              f"escaped); rename it")
        try:
            os.scandir(cdir).close()
        except OSError as exc:
            raise SourceError(f"{cdir}: class folder cannot be read ({exc.strerror or exc}); without it the "
                              f"class list would lose {entry.name!r}") from None
        for full in _walk_videos(root, cdir, problems):
            entries.append((os.path.splitext(os.path.relpath(full, root))[0], full, entry.name))
    if not entries:
        first = f"; {len(problems)} could not be used, the first: {problems[0].path}: {problems[0].reason}" \
            if problems else ""
        raise SourceError(f"{root}: no video files in class folders (expected {root}/<class>/<video>.mp4){first}")
    return _finish("folders", entries, _read_classes(classes_file), problems)


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
