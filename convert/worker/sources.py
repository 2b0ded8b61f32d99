"""Dataset sources: Kinetics annotation CSV, list file, or a tree of class folders.

Every source becomes a sorted list of ``VideoItem`` plus the class names; entries
that cannot be used (missing file, path escaping the video root, duplicate id,
a video that two CSV rows label differently, a file that is no regular file, a
name that is not UTF-8, a folder that cannot be read, a symbolic link looping
back to a folder above it) are returned as
``Problem`` records instead of raising, so a 240k-video job reports them and
goes on. What would change the meaning of every entry (the class list, the
labels, a class name holding a control character) stops the job instead,
with one line naming the file and line. Video paths are absolute: what a plan records does
not depend on the working directory of the run that wrote it.
"""

from __future__ import annotations

import codecs
import csv
import errno
import io
import math
import os
import stat
import unicodedata
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

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
    """The UTF-8 text of the source file ``path`` (a CSV, a list, a class list), without the byte-order mark that
    some programs (a spreadsheet saving "CSV UTF-8") put first; SourceError naming the file, and the line of
    the first byte that is not UTF-8.

    Read whole and decoded at once, so an error can say where: a line
    number, not an offset into a decoder's buffer. The mark was read as part
    of the first column's name, so a CSV with one seemed to lack its ``label``
    column.
    """
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise SourceError(f"{path}: the {what} is not a regular file")
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise SourceError(f"{path}: cannot read the {what}: {exc.strerror or exc}") from None
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8):]  # no line break in it: the line numbers stay the file's
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise SourceError(f"{path}: line {line}: not valid UTF-8 ({exc.reason}: byte "
                          f"{data[exc.start:exc.start + 1]!r}); save the {what} as UTF-8") from None


def printable(text: str) -> str:
    """``text`` with each character that is not printable (a control character, a line separator, a lone
    surrogate...) replaced by its Python escape (``\\x1b``, ``\\n``): safe to write to a terminal, one line."""
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


def check_class_name(name: str, where: str, what: str = "class name") -> None:
    """SourceError naming ``where`` (a file, and a line) when the class name ``name`` holds a control character;
    ``what`` says what the name is there (a label, a folder name).

    Class names are printed (``inspect``, the summary) and given back one a
    line through ``--classes``: an escape sequence would reach the terminal,
    and a name holding a newline could never be given back.
    """
    bad = next((ch for ch in name if unicodedata.category(ch) == "Cc"), None)
    if bad is not None:
        raise SourceError(f"{where}: {what} {name!r} holds a control character ({bad!r}); class names are "
                          f"printed, and given back one a line through --classes: take it out of the name")


def _read_classes(path: str | None) -> list[str] | None:
    if path is None:
        return None
    names = []
    for n, line in enumerate(read_text(path, "class list").splitlines(), start=1):
        if line.strip():
            check_class_name(line.strip(), f"{path}: line {n}")
            names.append(line.strip())
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


def _stat_video(path: str) -> os.stat_result | tuple[str, str]:
    """``path``'s stat (symbolic links followed) when it is a regular file, else (status, reason) saying why
    it cannot be a video to convert."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "missing", "file not found" if not os.path.islink(path) else "broken symbolic link"
    except OSError as exc:
        return "rejected", f"cannot be read: {exc.strerror or exc}"
    if stat.S_ISREG(st.st_mode):
        return st
    return "rejected", f"not a regular file ({_kind(st.st_mode)}): never opened as a video"


def file_problem(path: str) -> tuple[str, str] | None:
    """(status, reason) when ``path`` cannot be a video to convert, None when it is a regular file.

    A FIFO, a socket or a device named like a video would block or never end
    in whatever opens it (a FIFO with no writer hangs ``open``): only regular
    files are ever given to a decoder.
    """
    st = _stat_video(path)
    return None if isinstance(st, os.stat_result) else st  # (a stat_result is a tuple too)


class _Found(NamedTuple):
    """A video file a walk found: its absolute path, the (st_dev, st_ino) of its folder entry (of the link when
    it is a symbolic link to a file), whether a link to a folder below the class folder led to it, the
    (st_dev, st_ino) of the file itself (what a link to a file leads to), and whether the entry is such a link.

    The entry, not the file a link to a file leads to: folders of links to
    shared files (a benchmark's, git-annex's) are one video per link, as
    before; a folder reached again through a link gives the same entries.
    """

    path: str
    key: tuple[int, int]
    linked: bool
    file: tuple[int, int]
    file_link: bool


@dataclass
class _Walk:
    """One walk of a tree of folders: where it reports, and the folders it has seen, by (st_dev, st_ino).

    Symbolic links to folders are followed (a class folder may gather videos
    stored elsewhere), so the same folder can be reached again: a link back to
    a folder on the walk's own path would be walked forever (``a/up -> ..``
    to the 40 levels the kernel allows, exponentially with two such links),
    and a link to a folder walked already would give its videos twice.
    """

    root: str
    problems: list[Problem]
    path: dict[tuple[int, int], str] = field(default_factory=dict)  # folders being walked -> how to name them
    walked: dict[tuple[int, int], tuple[str, bool]] = field(default_factory=dict)  # -> (name, reached by a link)

    def name(self, full: str) -> str:
        """``full`` as reports name a folder: relative to the root, ending in "/"."""
        rel = os.path.relpath(full, self.root)
        return "the root folder" if rel == "." else shown(rel) + "/"


def _walk_videos(walk: _Walk, top: str, key: tuple[int, int], linked: bool) -> Iterator[_Found]:
    """The regular video files under the folder ``top`` (whose (st_dev, st_ino) is ``key``), folders and
    names sorted, at any depth; ``linked``: ``top`` was reached through a symbolic link below a class folder.

    What ``os.walk`` would skip without a word is a ``Problem`` here, named
    by its path relative to the root: a folder that cannot be read, a name
    that is not UTF-8 (shown with its bytes escaped), a video-named file that
    is no regular file. A symbolic link back to a folder the walk is in (a
    loop), or to a folder walked already, is reported once and not followed;
    a folder first reached through a link is walked again when reached
    without one, so that its videos are found under their own path.
    """
    root, problems = walk.root, walk.problems
    walk.path[key] = walk.name(top)
    walk.walked[key] = (walk.name(top), linked)
    try:
        try:
            with os.scandir(top) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            rel = os.path.relpath(top, root)
            problems.append(Problem(shown(rel) + "/", shown(top), "rejected",
                                    f"folder cannot be read ({exc.strerror or exc}): the videos in it are not "
                                    f"converted"))
            return
        for entry in entries:
            full = os.path.join(top, entry.name)
            is_video_name = os.path.splitext(entry.name)[1].lower() in VIDEO_EXTENSIONS
            try:
                is_dir = entry.is_dir()
            except OSError as exc:
                if exc.errno == errno.ELOOP and not is_video_name:  # a video-named one is reported below
                    problems.append(Problem(walk.name(full), shown(full), "rejected",
                                            f"symbolic link loop ({exc.strerror}): not followed"))
                    continue
                is_dir = False
            if is_dir:
                if _undecodable(entry.name):
                    problems.append(Problem(walk.name(full), shown(full), "rejected",
                                            "folder name is not valid UTF-8 (shown with its bytes escaped): the "
                                            "videos in it are not converted; rename it"))
                    continue
                yield from _walk_folder(walk, full, linked or entry.is_symlink())
                continue
            if not is_video_name:
                continue
            vid = os.path.splitext(os.path.relpath(full, root))[0]
            if _undecodable(entry.name):
                problems.append(Problem(shown(vid), shown(full), "rejected",
                                        "file name is not valid UTF-8 (shown with its bytes escaped); rename it"))
                continue
            st = _stat_video(full)
            if not isinstance(st, os.stat_result):  # (status, reason)
                problems.append(Problem(vid, full, *st))
                continue
            # The entry's inode from the listing (no system call); the file's from the stat that followed links.
            yield _Found(full, (key[0], entry.inode()), linked, (st.st_dev, st.st_ino), entry.is_symlink())
    finally:
        del walk.path[key]


def _walk_folder(walk: _Walk, full: str, linked: bool) -> Iterator[_Found]:
    """``_walk_videos`` of the sub-folder ``full``, unless it is a folder the walk is in (a loop) or one it
    has walked already as well as it could (without a link, or now only through one): then one ``Problem``."""
    try:
        st = os.stat(full)
    except OSError as exc:  # gone since the listing, or a link the kernel cannot resolve
        walk.problems.append(Problem(walk.name(full), shown(full), "rejected",
                                     f"folder cannot be read ({exc.strerror or exc}): the videos in it are not "
                                     f"converted"))
        return
    key = (st.st_dev, st.st_ino)
    if key in walk.path:
        walk.problems.append(Problem(walk.name(full), shown(full), "rejected",
                                     f"symbolic link loop: leads back to {walk.path[key]}, which it is in; "
                                     f"not followed"))
        return
    seen = walk.walked.get(key)
    if seen is not None and (linked or not seen[1]):
        walk.problems.append(Problem(walk.name(full), shown(full), "rejected",
                                     f"the same folder as {seen[0]}, walked already: its videos are converted "
                                     f"once, from there"))
        return
    yield from _walk_videos(walk, full, key, linked)


def _root_walk(root: str) -> tuple[_Walk, tuple[int, int]]:
    """A new walk of ``root``, and the root's (st_dev, st_ino)."""
    try:
        st = os.stat(root)
    except OSError as exc:
        raise SourceError(f"{root}: cannot be read: {exc.strerror or exc}") from None
    return _Walk(root, []), (st.st_dev, st.st_ino)


def _index_tree(root: str) -> tuple[dict[str, str], dict[str, Problem], list[Problem]]:
    """Each video file's stem and path, walking ``root`` once; the stems of files that cannot be used (a
    FIFO...), with their problem; the folders that cannot be read. A file a row does not name is nobody's
    problem: the root may hold other splits."""
    walk, key = _root_walk(root)
    index: dict[str, _Found] = {}
    for found in _walk_videos(walk, root, key, False):
        stem = os.path.splitext(os.path.basename(found.path))[0]
        # The path without a link wins: a file reached through a link is the same file.
        if stem not in index or (index[stem].linked and not found.linked):
            index[stem] = found
    folders = [p for p in walk.problems if p.id.endswith("/")]
    unusable = {os.path.basename(p.id): p for p in walk.problems if not p.id.endswith("/")}
    return {stem: f.path for stem, f in index.items()}, unusable, folders


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


def csv_table(csv_path: str) -> tuple[list[tuple[int, dict[str, str]]], list[tuple[int, dict[str, str], str]]]:
    """The rows of a Kinetics annotation CSV: (file line, row) of every well-formed one, its cells stripped;
    and (file line, row, reason) of every row whose number of fields is not the header's. SourceError naming
    the file when it lacks a required column (``CSV_REQUIRED``) or is not readable as CSV.

    A row with a field too many or too few has its cells in the wrong
    columns (a label holding an unquoted comma shifts every cell after it):
    read by name, it would give a wrong label, id or split without a word.
    """
    with io.StringIO(read_text(csv_path, "CSV"), newline="") as fh:
        reader = csv.reader(fh)
        read = 0  # the file line the last row read whole ended on
        try:
            columns = [c.strip() for c in next(reader, [])]
            read = reader.line_num
            missing_cols = [c for c in CSV_REQUIRED if c not in columns]
            if missing_cols:
                raise SourceError(
                    f"{csv_path}: CSV lacks column(s) {', '.join(missing_cols)}; "
                    f"needs {','.join(CSV_REQUIRED)}[,split][,is_cc], has {','.join(columns) or 'none'}"
                )
            rows: list[tuple[int, dict[str, str]]] = []
            malformed: list[tuple[int, dict[str, str], str]] = []
            for fields in reader:
                # reader.line_num after a row is the file line it ended on.
                n = read = reader.line_num
                if not fields:
                    continue  # a blank line
                row = dict(zip(columns, (v.strip() for v in fields)))
                if len(fields) != len(columns):
                    malformed.append((n, row, f"line {n}: {len(fields)} field(s), the header has {len(columns)} "
                                              f"({','.join(columns)}): not read (a value holding a comma must be "
                                              f"quoted)"))
                    continue
                rows.append((n, row))
            return rows, malformed
        except csv.Error as exc:
            raise SourceError(f"{csv_path}: not readable as CSV after line {read}: {exc}") from None


def csv_rows(csv_path: str) -> list[tuple[int, dict[str, str]]]:
    """(file line, row) of every well-formed row of a Kinetics annotation CSV, its cells stripped (``csv_table``:
    a row with too many or too few fields is left out); SourceError naming the file when it lacks a required
    column (``CSV_REQUIRED``) or is not readable as CSV."""
    return csv_table(csv_path)[0]


def csv_video_id(row: dict[str, str]) -> str:
    """The id ``python -m convert`` gives the video of a Kinetics CSV row: ``<youtube_id>_<start:06d>_<end:06d>``
    (whole seconds); ValueError saying why a row names no clip."""
    start, end = _csv_times(row)
    return f"{row['youtube_id']}_{start:06d}_{end:06d}"


class LabelConflict(NamedTuple):
    """Two rows of an annotation list that name one video with different labels: (line, label) each, in order."""

    video: str
    line: int
    label: str
    other_line: int
    other_label: str

    def describe(self) -> str:
        return (f"lines {self.line} and {self.other_line} both name video {self.video}, labelled "
                f"{self.label!r} and {self.other_label!r}")


def label_conflicts(named: Iterable[tuple[int, str, str]]) -> dict[str, LabelConflict]:
    """The videos that rows (line, video id, label) label twice, differently: video id -> its first such pair,
    in the order of the lines. Rows repeated with the same label are no conflict (one row says it all)."""
    first: dict[str, tuple[int, str]] = {}
    found: dict[str, LabelConflict] = {}
    for n, vid, label in sorted(named):
        if vid not in first:
            first[vid] = (n, label)
        elif first[vid][1] != label and vid not in found:
            found[vid] = LabelConflict(vid, *first[vid], n, label)
    return found


def csv_labels(rows: list[tuple[int, dict[str, str]]], split: str | None) -> Iterator[tuple[int, str, str]]:
    """(line, video id, label) of each row of ``split`` (every row: None) that names a clip and has a label."""
    for n, row in rows:
        if not row["label"] or not row["youtube_id"] or (split is not None and row.get("split", "") != split):
            continue
        try:
            yield n, csv_video_id(row), row["label"]
        except ValueError:
            continue  # names no clip: no video of the list


def from_csv(csv_path: str, videos: str, *, split: str | None = None, classes_file: str | None = None) -> Source:
    """Kinetics annotations; files found flat or in class folders under ``videos``."""
    if not os.path.isdir(videos):
        raise SourceError(f"{videos}: --videos is not a directory")
    csv_path, videos = os.path.abspath(csv_path), os.path.abspath(videos)
    rows, malformed = csv_table(csv_path)
    index, unusable, problems = _index_tree(videos)
    # A video two rows label differently has no label to trust: neither row is converted (rows repeated alike
    # are the one video, the repeat a duplicate as in any source).
    conflicts = label_conflicts(csv_labels(rows, split))
    entries = []
    lines: list[tuple[int, dict[str, str], str | None]] = [(n, row, None) for n, row in rows]
    lines = sorted(lines + list(malformed), key=lambda line: line[0])
    for n, row, malformed_reason in lines:
        if malformed_reason is not None:
            # Whatever its split, and named by its line: the cells of such a row are in the wrong columns, its
            # split and youtube_id too.
            problems.append(Problem(f"line {n}", csv_path, "rejected", malformed_reason))
            continue
        if split is not None and row.get("split", "") != split:
            continue
        yid = row["youtube_id"]
        try:
            stem = csv_video_id(row)
        except ValueError as exc:
            problems.append(Problem(yid, csv_path, "rejected", f"line {n}: {exc}"))
            continue
        if not row["label"]:
            problems.append(Problem(stem, csv_path, "rejected", f"line {n}: no label"))
            continue
        if stem in conflicts:
            if conflicts[stem].line == n:  # said once, for its first row
                problems.append(Problem(stem, csv_path, "rejected",
                                        f"{conflicts[stem].describe()}: which one is right is not known"))
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
        for n, row in rows:
            check_class_name(row["label"], f"{csv_path}: line {n}", "label")
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
    if classes_file is None:  # the names are the class list (with one, a label not in it is a rejected line)
        for n, lab in names:
            check_class_name(lab, f"{list_path}: line {n}", "label")
    return _finish("list", entries, _read_classes(classes_file), problems, numeric=not names)


def from_folders(root: str, *, classes_file: str | None = None) -> Source:
    """``root/<class>/**/<video>``: the class is the first folder level.

    A class folder that cannot be read (a symbolic link loop among them), or
    whose name is not UTF-8 or holds a control character, stops the job (it
    would drop a class and renumber the others); anything below it that cannot
    be used is a ``Problem`` (``_walk_videos``). Each file is converted once,
    under the class it is in: one also reached through a symbolic link to a
    folder (to another class's folder) is reported, not converted again under
    the label of the folder holding the link. So is a symbolic link to a file
    another class folder holds (found there without a link): the file is
    converted there, once. Any other symbolic link to a file (within its own
    class, or to a file outside the class folders) is an entry of its own.
    """
    root = os.path.abspath(root)
    walk, root_key = _root_walk(root)
    try:
        with os.scandir(root) as it:
            listing = sorted(it, key=lambda e: e.name)
    except OSError as exc:
        raise SourceError(f"{root}: cannot be read: {exc.strerror or exc}") from None
    classes = []
    for entry in listing:
        try:
            if entry.is_dir():
                classes.append(entry)
        except OSError as exc:  # is_dir raises what is not "no such file": ELOOP for root/cls -> cls
            what = "is a symbolic link loop" if exc.errno == errno.ELOOP else "cannot be read"
            raise SourceError(f"{root}: {entry.name!r} {what} ({exc.strerror or exc}): it may be a class folder, "
                              f"and the class list must not lose one; fix or remove it") from None
    found: list[tuple[str, _Found]] = []  # (class, video)
    walk.path[root_key] = walk.name(root)  # a link back to the root, from any depth, is a loop
    for entry in classes:
        cdir = os.path.join(root, entry.name)
        if _undecodable(entry.name):
            raise SourceError(f"{shown(cdir)}: class folder name is not valid UTF-8 (shown with its bytes "
                              f"escaped); rename it")
        check_class_name(entry.name, root, "class folder name")
        try:
            os.scandir(cdir).close()
            st = os.stat(cdir)
        except OSError as exc:
            raise SourceError(f"{cdir}: class folder cannot be read ({exc.strerror or exc}); without it the "
                              f"class list would lose {entry.name!r}") from None
        if (st.st_dev, st.st_ino) == root_key:
            raise SourceError(f"{root}: class folder {entry.name!r} is a symbolic link loop (it is the root "
                              f"folder itself); remove it")
        # A class folder is walked even when another class's folder is the same one (a link): each is a class.
        found += [(entry.name, f) for f in _walk_videos(walk, cdir, (st.st_dev, st.st_ino), False)]
    problems = walk.problems
    ids = {f.path: os.path.splitext(os.path.relpath(f.path, root))[0] for _, f in found}
    # Files reached without a link to a folder first: a file's own class is the one it is in, not one linking
    # to its folder. Two entries of one file met without such a link (hard links) are both kept, as before.
    first: dict[tuple[int, int], str] = {}
    for _, f in sorted(found, key=lambda cf: cf[1].linked):
        first.setdefault(f.key, ids[f.path])
    # The same for a link to a file: the file's own class is the class folder holding it without any link
    # (its real path, when that is inside the root), never the class of a folder holding a link to it.
    holders: dict[tuple[int, int], dict[str, str]] = {}  # file -> {class holding it: its first id there}
    for name, f in found:
        if not f.linked and not f.file_link:
            holders.setdefault(f.file, {}).setdefault(name, ids[f.path])
    owner: dict[str, str] = {}  # id of a link to another class's file -> the id the file is converted as
    for name, f in found:
        held = holders.get(f.file, {})
        if f.file_link and held and name not in held:  # (a link within its own class is an entry of its own)
            owner[ids[f.path]] = next(iter(held.values()))
    entries: list[tuple[str, str, str]] = []
    for name, f in found:
        vid = ids[f.path]
        if f.linked and first[f.key] != vid:
            to = owner.get(first[f.key], first[f.key])
            problems.append(Problem(vid, f.path, "rejected", f"the same file as {to}, reached through a symbolic "
                                                             f"link to a folder: converted once, as {to}"))
            continue
        if vid in owner:
            problems.append(Problem(vid, f.path, "rejected", f"the same file as {owner[vid]}, reached through a "
                                                             f"symbolic link from another class's folder: "
                                                             f"converted once, as {owner[vid]}, under its own "
                                                             f"class"))
            continue
        entries.append((vid, f.path, name))
    if not entries:
        first_problem = f"; {len(problems)} could not be used, the first: {problems[0].path}: " \
            f"{problems[0].reason}" if problems else ""
        raise SourceError(f"{root}: no video files in class folders (expected {root}/<class>/<video>.mp4)"
                          f"{first_problem}")
    return _finish("folders", entries, _read_classes(classes_file), problems)


# The kinds of source, as messages name them.
SOURCE_KINDS = {"csv": "a Kinetics CSV", "list": "a list file", "folders": "a folder of class folders"}


def source_kind(src: str) -> str:
    """The kind of the existing source ``src``, a key of ``SOURCE_KINDS``: a folder, a ``.csv`` file, else a
    list file."""
    if os.path.isdir(src):
        return "folders"
    return "csv" if src.lower().endswith(".csv") else "list"


def split_problem(src: str, split: str | None) -> str | None:
    """Why ``--split`` cannot be given with the source ``src``, or None when it can (it is not given, the
    source is a CSV, or ``src`` does not exist: that is said on its own).

    Only a Kinetics CSV has a split column; for any other source the
    option would select nothing, and a user who gave it believes the
    conversion holds one split when it holds everything.
    """
    if split is None or not os.path.exists(src):
        return None
    kind = source_kind(src)
    if kind == "csv":
        return None
    return (f"argument --split: only a Kinetics CSV source has a split column; SRC {src} is "
            f"{SOURCE_KINDS[kind]}: drop --split, or give the CSV")


def load_source(src: str, *, videos: str | None = None, split: str | None = None,
                classes_file: str | None = None) -> Source:
    """Pick the reader by what ``src`` is: a folder, a ``.csv`` file, or a list file. SourceError for a
    ``split`` with a source that is no CSV (``split_problem``)."""
    if not os.path.exists(src):
        raise SourceError(f"{src}: no such file or directory")
    why = split_problem(src, split)
    if why is not None:
        raise SourceError(why)
    kind = source_kind(src)
    if kind == "folders":
        return from_folders(src, classes_file=classes_file)
    if kind == "csv":
        if videos is None:
            raise SourceError(f"{src}: a CSV source needs --videos DIR (where the video files are)")
        return from_csv(src, videos, split=split, classes_file=classes_file)
    return from_list(src, videos, classes_file=classes_file)
