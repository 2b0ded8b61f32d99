"""Symbolic links in a tree of class folders: loops, links into another class, a class folder that loops."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from convert.worker.sources import SourceError, from_csv, from_folders

from .conftest import ROOT
from .convert_helpers import run_cli


def _planned(root: str) -> tuple[list[tuple[str, int]], list[tuple[str, str, str]]]:
    """``from_folders(root)`` in a child process that must finish in 60 s: (id, label) of each item, and
    (id, status, reason) of each problem. A walk that follows a loop exponentially fails here, not hangs."""
    code = ("import json, sys\nfrom convert.worker.sources import from_folders\ns = from_folders(sys.argv[1])\n"
            "print(json.dumps([[(i.id, i.label) for i in s.items], [(p.id, p.status, p.reason) for p in s.problems]]))")
    r = subprocess.run([sys.executable, "-c", code, root], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    items, problems = json.loads(r.stdout)
    return [tuple(i) for i in items], sorted(tuple(p) for p in problems)


def _loop(link: str, target: str) -> tuple[str, str, str]:
    return (link, "rejected", f"symbolic link loop: leads back to {target}, which it is in; not followed")


def test_a_link_back_up_in_a_class_folder_is_reported_once_and_each_video_converted_once(touch_video, tmp_path):
    """``a/up -> ..`` converted a/x up to 40 times (a/up/a/up/.../a/x) and b/y under a's label."""
    root = tmp_path / "src"
    touch_video(str(root / "a" / "x.mp4"))
    touch_video(str(root / "b" / "y.mp4"))
    os.symlink("..", root / "a" / "up")
    src = from_folders(str(root))
    assert src.classes == ["a", "b"]
    assert [(it.id, it.label) for it in src.items] == [("a/x", 0), ("b/y", 1)]
    assert [(p.id, p.status, p.reason) for p in src.problems] == [_loop("a/up/", "the root folder")]
    out = tmp_path / "out"
    r = run_cli(str(root), str(out), "--short", "loop", "--workers", "1", "--no-progress")
    assert r.returncode == 0, r.stderr
    report = [json.loads(line) for line in open(out / "report.jsonl")]
    assert sorted((p["id"], p["status"]) for p in report) == [("a/up/", "rejected"), ("a/x", "padded"),
                                                              ("b/y", "padded")]
    assert json.load(open(out / "manifest.json"))["status_counts"] == {"padded": 2, "rejected": 1}


def test_nested_loops_and_links_into_another_class_finish_at_once_with_each_video_once_under_its_class(
        touch_video, tmp_path):
    """Two loops made the walk exponential: no plan after 300 s."""
    root = tmp_path / "src"
    touch_video(str(root / "a" / "x.mp4"))
    touch_video(str(root / "a" / "sub" / "y.mp4"))
    touch_video(str(root / "b" / "z.mp4"))
    touch_video(str(root / "c" / "w.mp4"))
    os.symlink("..", root / "a" / "up")                 # to the root
    os.symlink("../..", root / "a" / "sub" / "top")     # to the root, from deeper
    os.symlink("..", root / "a" / "sub" / "back")       # to the class folder
    os.symlink(".", root / "a" / "sub" / "here")        # to itself
    os.symlink("../a", root / "b" / "to_a")             # into a class walked already
    os.symlink("../c", root / "b" / "to_c")             # into a class not walked yet
    items, problems = _planned(str(root))
    assert items == [("a/sub/y", 0), ("a/x", 0), ("b/z", 1), ("c/w", 2)]
    assert problems == sorted([
        _loop("a/up/", "the root folder"), _loop("a/sub/top/", "the root folder"), _loop("a/sub/back/", "a/"),
        _loop("a/sub/here/", "a/sub/"),
        ("b/to_a/", "rejected", "the same folder as a/, walked already: its videos are converted once, from there"),
        ("b/to_c/w", "rejected", "the same file as c/w, reached through a symbolic link to a folder: converted "
                                 "once, as c/w")])


def test_a_link_into_another_class_gives_its_videos_once_under_their_class_and_file_links_stay_videos(
        touch_video, tmp_path):
    """``a/borrowed -> ../b/sub`` gave b/sub/y as a/borrowed/y, labelled a, besides b/sub/y."""
    root = tmp_path / "src"
    touch_video(str(root / "a" / "x.mp4"))
    touch_video(str(root / "b" / "sub" / "y.mp4"))
    os.symlink("../b/sub", root / "a" / "borrowed")
    # Links to files are entries of their own, as a benchmark's tree of links to a few shared files.
    shared = tmp_path / "elsewhere" / "v.mp4"
    touch_video(str(shared))
    os.symlink(shared, root / "a" / "0_v.mp4")
    os.symlink(shared, root / "b" / "1_v.mp4")
    os.symlink("x.mp4", root / "a" / "alias.mp4")
    src = from_folders(str(root))
    assert [(it.id, it.label) for it in src.items] == [
        ("a/0_v", 0), ("a/alias", 0), ("a/x", 0), ("b/1_v", 1), ("b/sub/y", 1)]
    assert [(p.id, p.reason) for p in src.problems] == [
        ("a/borrowed/y", "the same file as b/sub/y, reached through a symbolic link to a folder: converted once, "
                         "as b/sub/y")]


def test_a_loop_under_the_video_root_of_a_csv_is_reported_and_its_rows_found(touch_video, tmp_path):
    root = tmp_path / "v"
    touch_video(str(root / "dance" / "q_000001_000011.mp4"))
    os.symlink("..", root / "dance" / "up")
    csv = tmp_path / "k.csv"
    csv.write_text("label,youtube_id,time_start,time_end,split\ndance,q,1,11,train\n")
    src = from_csv(str(csv), str(root))
    assert [(it.id, it.path) for it in src.items] == [("q_000001_000011", str(root / "dance" / "q_000001_000011.mp4"))]
    assert [(p.id, p.reason) for p in src.problems] == [
        ("dance/up/", "symbolic link loop: leads back to the root folder, which it is in; not followed")]


@pytest.mark.parametrize("link", ["cls", "."])
def test_a_class_folder_that_is_a_symbolic_link_loop_stops_the_job_in_one_line_naming_the_root(
        touch_video, tmp_path, link):
    root = tmp_path / "src"
    touch_video(str(root / "a" / "x.mp4"))
    os.symlink(link, root / "cls")
    message = {"cls": f"{root}: 'cls' is a symbolic link loop (Too many levels of symbolic links): it may be a "
                      f"class folder, and the class list must not lose one; fix or remove it",
               ".": f"{root}: class folder 'cls' is a symbolic link loop (it is the root folder itself); "
                    f"remove it"}[link]
    with pytest.raises(SourceError) as info:
        from_folders(str(root))
    assert str(info.value) == message
    r = run_cli(str(root), str(tmp_path / "out"))
    assert (r.returncode, r.stdout, r.stderr) == (2, "", f"convert: error: {message}\n")
    assert not os.path.exists(tmp_path / "out")


def test_a_link_to_a_file_of_another_class_converts_it_once_under_its_own_class_and_reports_the_link_once(
        touch_video, tmp_path):
    """``b/link.mp4 -> ../a/x.mp4`` converted a/x twice: as a/x labelled a, and as b/link labelled b."""
    root = tmp_path / "src"
    touch_video(str(root / "a" / "x.mp4"))
    touch_video(str(root / "b" / "y.mp4"))
    touch_video(str(root / "c" / "w.mp4"))
    os.symlink("../a/x.mp4", root / "b" / "link.mp4")
    os.makedirs(root / "b" / "sub")
    os.symlink("../../c/w.mp4", root / "b" / "sub" / "deep.mp4")   # from deeper, into a later class
    os.symlink("../b/sub", root / "a" / "borrowed")                # and that link reached through a folder link
    os.symlink("y.mp4", root / "b" / "alias.mp4")                  # within its own class: an entry of its own
    src = from_folders(str(root))
    assert [(it.id, it.label) for it in src.items] == [("a/x", 0), ("b/alias", 1), ("b/y", 1), ("c/w", 2)]
    other = "reached through a symbolic link from another class's folder: converted once, as {}, under its own class"
    assert sorted((p.id, p.reason) for p in src.problems) == [
        ("a/borrowed/deep", "the same file as c/w, reached through a symbolic link to a folder: converted once, "
                            "as c/w"),
        ("b/link", "the same file as a/x, " + other.format("a/x")),
        ("b/sub/deep", "the same file as c/w, " + other.format("c/w"))]
    out = tmp_path / "out"
    r = run_cli(str(root), str(out), "--short", "loop", "--workers", "1", "--no-progress")
    assert r.returncode == 0, r.stderr
    report = [json.loads(line) for line in open(out / "report.jsonl")]
    assert sorted((p["id"], p["status"]) for p in report) == [
        ("a/borrowed/deep", "rejected"), ("a/x", "padded"), ("b/alias", "padded"), ("b/link", "rejected"),
        ("b/sub/deep", "rejected"), ("b/y", "padded"), ("c/w", "padded")]
    assert json.load(open(out / "manifest.json"))["status_counts"] == {"padded": 4, "rejected": 3}
