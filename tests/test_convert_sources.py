"""Sources: Kinetics CSV (flat and class-folder layouts), list files, class folders."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from convert.worker.sources import SourceError, from_csv, from_folders, from_list, load_source

CSV_HEADER = "label,youtube_id,time_start,time_end,split\n"


def test_csv_flat_and_class_folder_layouts(touch_video, tmp_path):
    root = tmp_path / "videos"
    touch_video(str(root / "abc_000010_000020.mp4"))                       # flat
    touch_video(str(root / "arm wrestling" / "xyz_000001_000011.mp4"))     # class folder
    csv = tmp_path / "k400.csv"
    csv.write_text(CSV_HEADER
                   + "arm wrestling,xyz,1,11,train\n"
                   + "abseiling,abc,10,20,train\n"
                   + "abseiling,gone,5,15,train\n"
                   + "abseiling,val1,0,10,val\n")
    src = from_csv(str(csv), str(root), split="train")
    assert src.classes == ["abseiling", "arm wrestling"]
    assert [(it.id, it.label) for it in src.items] == [("abc_000010_000020", 0), ("xyz_000001_000011", 1)]
    assert src.items[1].path.endswith(os.path.join("arm wrestling", "xyz_000001_000011.mp4"))
    assert [(p.id, p.status) for p in src.problems] == [("gone_000005_000015", "missing")]


def test_csv_with_is_cc_column_and_float_times(touch_video, tmp_path):
    root = tmp_path / "v"
    touch_video(str(root / "q_000003_000013.mp4"))
    csv = tmp_path / "k700.csv"
    csv.write_text("label,youtube_id,time_start,time_end,split,is_cc\ndancing,q,3.0,13.0,train,0\n")
    src = from_csv(str(csv), str(root))
    assert [it.id for it in src.items] == ["q_000003_000013"]


def test_csv_missing_columns_is_one_clear_error(tmp_path):
    csv = tmp_path / "bad.csv"
    csv.write_text("label,video\nx,y\n")
    with pytest.raises(SourceError, match=r"bad.csv: CSV lacks column\(s\) youtube_id, time_start, time_end"):
        from_csv(str(csv), str(tmp_path))


def test_csv_needs_videos_dir(tmp_path):
    csv = tmp_path / "a.csv"
    csv.write_text(CSV_HEADER)
    with pytest.raises(SourceError, match="needs --videos"):
        load_source(str(csv))


def test_csv_youtube_id_cannot_escape(tmp_path):
    csv = tmp_path / "a.csv"
    csv.write_text(CSV_HEADER + "x,../../etc,1,2,train\n")
    src = from_csv(str(csv), str(tmp_path))
    assert src.items == [] and src.problems[0].status == "rejected"
    assert "would leave the video root" in src.problems[0].reason


def test_list_file_rejects_escapes_and_counts_missing(touch_video, tmp_path):
    root = tmp_path / "root"
    touch_video(str(root / "a" / "v1.mp4"))
    touch_video(str(root / "b" / "v2.avi"))
    outside = tmp_path / "outside.mp4"
    touch_video(str(outside))
    lst = tmp_path / "train.txt"
    lst.write_text(f"a/v1.mp4 1\nb/v2.avi 0\n../outside.mp4 0\n{outside} 1\nmissing.mp4 0\n{root}/a/v1.mp4 1\n")
    src = from_list(str(lst), str(root))
    assert [(it.id, it.label) for it in src.items] == [("a/v1", 1), ("b/v2", 0)]
    statuses = sorted((p.status, p.id) for p in src.problems)
    assert statuses == [("missing", "missing"), ("rejected", "../outside"), ("rejected", "a/v1"),
                        ("rejected", str(outside)[1:-4])]
    assert src.classes == ["0", "1"]
    dup = [p for p in src.problems if p.id == "a/v1"][0]
    assert dup.reason == "duplicate video id"


def test_list_file_with_class_names_and_class_file(touch_video, tmp_path):
    root = tmp_path
    touch_video(str(root / "v1.mp4"))
    touch_video(str(root / "v2.mp4"))
    (root / "list.txt").write_text("v1.mp4 zebra\nv2.mp4 apple\n")
    (root / "classes.txt").write_text("zebra\napple\nmango\n")
    src = from_list(str(root / "list.txt"), classes_file=str(root / "classes.txt"))
    assert src.classes == ["zebra", "apple", "mango"]
    assert [(it.id, it.label) for it in src.items] == [("v1", 0), ("v2", 1)]


def test_class_folders(touch_video, tmp_path):
    touch_video(str(tmp_path / "walk" / "x.mp4"))
    touch_video(str(tmp_path / "jump" / "sub" / "y.webm"))
    (tmp_path / "jump" / "notes.txt").write_text("not a video")
    src = from_folders(str(tmp_path))
    assert src.classes == ["jump", "walk"]
    assert [(it.id, it.label) for it in src.items] == [("jump/sub/y", 0), ("walk/x", 1)]


def test_missing_source_is_one_clear_error(tmp_path):
    with pytest.raises(SourceError, match="no such file or directory"):
        load_source(str(tmp_path / "nope"))


def test_csv_rows_that_cannot_name_a_file_are_rejected_with_their_line(touch_video, tmp_path):
    root = tmp_path / "v"
    touch_video(str(root / "ok_000001_000011.mp4"))
    csv = tmp_path / "k.csv"
    csv.write_text(CSV_HEADER
                   + "dance,ok,1,11,train\n"
                   + "dance,a,inf,10,train\n"
                   + "\n"                                   # blank lines do not shift the numbering
                   + "dance,b,-inf,10,train\n"
                   + "dance,c,nan,10,train\n"
                   + "dance,d,,10,train\n"
                   + "dance,e,ten,20,train\n"
                   + "dance,f,-5,5,train\n"
                   + "dance,g,0,1e400,train\n"
                   + "dance,h,20,10,train\n"
                   + ",i,1,11,train\n"
                   + "dance,j,1\n")                           # short row: not read, reported
    src = from_csv(str(csv), str(root))
    assert [it.id for it in src.items] == ["ok_000001_000011"]
    assert [(p.id, p.status, p.reason) for p in src.problems] == [
        ("a", "rejected", "line 3: time_start 'inf' is not a finite number of seconds >= 0"),
        ("b", "rejected", "line 5: time_start '-inf' is not a finite number of seconds >= 0"),
        ("c", "rejected", "line 6: time_start 'nan' is not a finite number of seconds >= 0"),
        ("d", "rejected", "line 7: time_start '' is not a number"),
        ("e", "rejected", "line 8: time_start 'ten' is not a number"),
        ("f", "rejected", "line 9: time_start '-5' is not a finite number of seconds >= 0"),
        ("g", "rejected", "line 10: time_end '1e400' is not a finite number of seconds >= 0"),
        ("h", "rejected", "line 11: time_end '10' is before time_start '20'"),
        ("i_000001_000011", "rejected", "line 12: no label"),
        ("line 13", "rejected", "line 13: 3 field(s), the header has 5 (label,youtube_id,time_start,time_end,split): "
                          "not read (a value holding a comma must be quoted)"),
    ]


def test_csv_rows_with_too_many_or_too_few_fields_are_rejected_with_their_line(touch_video, tmp_path):
    """Such a row has its cells in the wrong columns: before, a short one was taken with empty cells (and
    dropped by --split without a word) and a long one read as if its extra fields were not there."""
    root = tmp_path / "v"
    for name in ("ok_000001_000011", "quoted_000001_000011", "long_000001_000011", "short_000001_000011"):
        touch_video(str(root / f"{name}.mp4"))
    csv = tmp_path / "k.csv"
    csv.write_text(CSV_HEADER
                   + "dance,ok,1,11,train\n"
                   + "tap, dance,long,1,11,train\n"         # a label holding an unquoted comma: 6 fields
                   + "dance,short,1,11\n"                    # no split: 4 fields
                   + '"tap, dance",quoted,1,11,train\n'      # quoted: one field, a well-formed row
                   + "dance,trailing,1,11,train,\n")         # a trailing comma: 6 fields
    header = "the header has 5 (label,youtube_id,time_start,time_end,split): not read (a value holding a comma " \
             "must be quoted)"
    malformed = [("line 3", "rejected", f"line 3: 6 field(s), {header}"),
                 ("line 4", "rejected", f"line 4: 4 field(s), {header}"),
                 ("line 6", "rejected", f"line 6: 6 field(s), {header}")]
    for split in (None, "train"):  # reported whatever the split: the split cell of such a row is no better
        src = from_csv(str(csv), str(root), split=split)
        assert [it.id for it in src.items] == ["ok_000001_000011", "quoted_000001_000011"]
        assert [(p.id, p.status, p.reason) for p in src.problems] == malformed
        assert all(p.path == str(csv) for p in src.problems)
        assert src.classes == ["dance", "tap, dance"]  # the labels of the well-formed rows only ("tap" is none)


def test_csv_job_reports_a_row_with_too_many_fields_as_rejected(stand_in_videos, tmp_path):
    from convert.job.run import JobOptions, run_job
    from convert.worker.plan import ConvertConfig

    root = tmp_path / "v"
    root.mkdir()
    shutil.copyfile(os.path.join(stand_in_videos, "torchcodec__h265_video.mp4"), root / "ok_000001_000011.mp4")
    csv = tmp_path / "k.csv"
    csv.write_text(CSV_HEADER + "dance,ok,1,11,train\nsalsa, dance,x,1,11,train\n")
    out = tmp_path / "out"
    result = run_job(str(csv), str(out), ConvertConfig(short="loop", size=(32, 40)),
                     JobOptions(workers=1, progress=False), videos=str(root), split="train")
    assert result["status_counts"] == {"padded": 1, "rejected": 1}
    report = [json.loads(line) for line in (out / "report.jsonl").read_text().splitlines()]
    assert {"id": "line 3", "path": str(csv), "status": "rejected",
            "reason": "line 3: 6 field(s), the header has 5 (label,youtube_id,time_start,time_end,split): not read "
                      "(a value holding a comma must be quoted)"} in report


def test_csv_job_with_an_inf_row_reports_it_and_converts_the_rest(touch_video, tmp_path):
    from convert.job.run import JobOptions, run_job
    from convert.worker.plan import ConvertConfig

    root = tmp_path / "v"
    touch_video(str(root / "ok_000001_000011.mp4"))
    csv = tmp_path / "k.csv"
    csv.write_text(CSV_HEADER + "dance,ok,1,11,train\ndance,bad,inf,10,train\n")
    out = tmp_path / "out"
    result = run_job(str(csv), str(out), ConvertConfig(short="loop"), JobOptions(workers=1, progress=False),
                     videos=str(root))
    assert result["status_counts"] == {"padded": 1, "rejected": 1}
    report = [json.loads(line) for line in (out / "report.jsonl").read_text().splitlines()]
    assert report[0] == {"id": "bad", "path": str(csv), "status": "rejected",
                         "reason": "line 3: time_start 'inf' is not a finite number of seconds >= 0"}


def test_csv_that_the_csv_module_cannot_parse_is_one_clear_error(tmp_path):
    csv = tmp_path / "k.csv"
    csv.write_text(CSV_HEADER + "dance,a,1,11,train\n" + "dance," + "x" * 200_000 + ",1,11,train\n")
    with pytest.raises(SourceError, match=r"k.csv: not readable as CSV after line 2: field larger than field limit"):
        from_csv(str(csv), str(tmp_path))


def test_csv_splits_share_one_class_list_when_a_split_lacks_a_class(touch_video, tmp_path):
    root = tmp_path / "v"
    for stem in ("t1_000000_000010", "t2_000000_000010", "t3_000000_000010", "v1_000000_000010"):
        touch_video(str(root / f"{stem}.mp4"))
    csv = tmp_path / "k.csv"
    csv.write_text(CSV_HEADER + "juggling,t1,0,10,train\nbowling,t2,0,10,train\nzumba,t3,0,10,train\n"
                   + "zumba,v1,0,10,val\n" + "archery,t4,0,10,test\n")  # no video: its class still counts
    train = from_csv(str(csv), str(root), split="train")
    val = from_csv(str(csv), str(root), split="val")
    assert train.classes == val.classes == ["archery", "bowling", "juggling", "zumba"]
    assert [(it.id, it.label) for it in val.items] == [("v1_000000_000010", 3)]
    assert [(it.id, it.label) for it in train.items] == [("t1_000000_000010", 2), ("t2_000000_000010", 1),
                                                         ("t3_000000_000010", 3)]
    from convert.job.run import JobOptions, run_job
    from convert.worker.plan import ConvertConfig

    manifests = [run_job(str(csv), str(tmp_path / split), ConvertConfig(short="loop"),
                         JobOptions(workers=1, progress=False), videos=str(root), split=split)
                 for split in ("train", "val")]
    assert [m["classes"] for m in manifests] == [["archery", "bowling", "juggling", "zumba"]] * 2
    assert [m["totals"]["videos"] for m in manifests] == [3, 1]
    (tmp_path / "classes.txt").write_text("zumba\njuggling\nbowling\n")
    fixed = from_csv(str(csv), str(root), split="val", classes_file=str(tmp_path / "classes.txt"))
    assert fixed.classes == ["zumba", "juggling", "bowling"] and fixed.items[0].label == 0


def test_videos_root_check_is_lexical_and_follows_symlinks_as_the_help_says(touch_video, tmp_path):
    from convert.cli import build_parser

    outside = tmp_path / "elsewhere" / "real.mp4"
    touch_video(str(outside))
    root = tmp_path / "root"
    root.mkdir()
    os.symlink(outside, root / "linked.mp4")                  # inside the root, pointing out of it
    lst = tmp_path / "list.txt"
    lst.write_text("linked.mp4 0\nsub/../linked.mp4 0\n../elsewhere/real.mp4 0\n")
    src = from_list(str(lst), str(root))
    assert [(it.id, it.path) for it in src.items] == [("linked", str(root / "linked.mp4"))]
    assert [(p.id, p.reason) for p in src.problems] == [
        ("../elsewhere/real", f"line 3: path escapes the video root {root}"),
        ("linked", "duplicate video id")]
    help_text = " ".join(build_parser().format_help().split())
    assert ("Entries are checked lexically, after normalising '..': one that leaves the root is rejected; "
            "symlinks inside the root are followed wherever they point, by design") in help_text


def _without_dac_capabilities() -> None:
    """In a child about to exec: drop CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH from its bounding set, so that
    root after exec is held to permission bits, as any user is (the suite runs as root)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
        if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def _convert_unprivileged(*args: str) -> subprocess.CompletedProcess:
    from .conftest import ROOT

    return subprocess.run([sys.executable, "-m", "convert", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, preexec_fn=_without_dac_capabilities)


def test_an_unreadable_sub_folder_is_reported_as_rejected_and_an_unreadable_class_folder_stops(touch_video, tmp_path):
    """Issue 19, point 4: os.walk skipped an unreadable folder without a word; its videos were simply absent."""
    touch_video(str(tmp_path / "src" / "a" / "x.mp4"))
    touch_video(str(tmp_path / "src" / "a" / "sub" / "y.mp4"))
    touch_video(str(tmp_path / "src" / "b" / "z.mp4"))
    sub = tmp_path / "src" / "a" / "sub"
    os.chmod(sub, 0)
    try:
        out = str(tmp_path / "out")
        r = _convert_unprivileged(str(tmp_path / "src"), out, "--short", "loop", "--workers", "1", "--no-progress")
        assert r.returncode == 0, r.stderr
        report = [json.loads(line) for line in open(os.path.join(out, "report.jsonl"))]
        assert [(p["id"], p["status"]) for p in report if p["status"] == "rejected"] == [("a/sub/", "rejected")]
        (rejected,) = [p for p in report if p["status"] == "rejected"]
        assert rejected["path"] == str(sub)
        assert rejected["reason"] == "folder cannot be read (Permission denied): the videos in it are not converted"
        assert f"rejected: {sub}: folder cannot be read" in r.stdout
        os.chmod(sub, 0o755)
        os.chmod(tmp_path / "src" / "b", 0)
        r = _convert_unprivileged(str(tmp_path / "src"), str(tmp_path / "out2"), "--no-progress")
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
        assert r.stderr == (f"convert: error: {tmp_path / 'src' / 'b'}: class folder cannot be read (Permission "
                            f"denied); without it the class list would lose 'b'\n")
        assert not os.path.exists(tmp_path / "out2")
    finally:
        os.chmod(sub, 0o755)
        os.chmod(tmp_path / "src" / "b", 0o755)


@pytest.mark.parametrize("labels, line, message", [
    (["0", "1", "v2", "1", "0"], 3, "label 'v2' is a name, but 4 labels are class numbers and 1 are names"),
    (["3", "10", "x", "2", "1"], 3, "label 'x' is a name, but 4 labels are class numbers and 1 are names"),
    (["0", "²", "1"], 2, "label '²' is a name, but 2 labels are class numbers and 1 are names"),
    (["walk", "jump", "7", "run"], 3, "label '7' is a number, but 1 labels are class numbers and 3 are names"),
])
def test_mixed_number_and_name_labels_in_a_list_file_are_refused_naming_the_line(touch_video, tmp_path, labels,
                                                                                 line, message):
    """Issue 19, point 4: one typo among class numbers turned every label into a name, renumbering them all;
    "²" (isdigit, yet no int) ended the job without naming the file."""
    for k in range(len(labels)):
        touch_video(str(tmp_path / f"v{k}.mp4"))
    lst = tmp_path / "list.txt"
    lst.write_text("".join(f"v{k}.mp4 {lab}\n" for k, lab in enumerate(labels)))
    with pytest.raises(SourceError) as info:
        from_list(str(lst))
    assert str(info.value) == (f"{lst}: line {line}: {message}; fix it, or give --classes FILE to read every "
                               f"label as a class name")
    (tmp_path / "classes.txt").write_text("".join(f"{lab}\n" for lab in dict.fromkeys(labels)))
    src = from_list(str(lst), classes_file=str(tmp_path / "classes.txt"))  # names, as the class list says
    assert [it.label for it in src.items] == [list(dict.fromkeys(labels)).index(lab) for lab in labels]
    from .convert_helpers import run_cli

    r = run_cli(str(lst), str(tmp_path / "out"))
    assert r.returncode == 2 and r.stderr == f"convert: error: {info.value}\n"


@pytest.mark.parametrize("kind", ["csv", "list", "classes"])
def test_a_source_file_that_is_not_utf8_is_one_line_naming_the_file_and_line(touch_video, tmp_path, kind):
    touch_video(str(tmp_path / "v" / "ok_000001_000011.mp4"))
    bad = "caf\xe9".encode("latin-1")  # "café" in Latin-1: 0xe9 is no UTF-8
    if kind == "csv":
        path = tmp_path / "k.csv"
        path.write_bytes(CSV_HEADER.encode() + b"dance,ok,1,11,train\n" + bad + b",x,1,11,train\n")
        args = [str(path), str(tmp_path / "out"), "--videos", str(tmp_path / "v")]
    elif kind == "list":
        path = tmp_path / "v" / "list.txt"
        path.write_bytes(b"ok_000001_000011.mp4 dance\n\n" + bad + b".mp4 dance\n")
        args = [str(path), str(tmp_path / "out")]
    else:
        path = tmp_path / "classes.txt"
        path.write_bytes(b"dance\n" + bad + b"\n")
        (tmp_path / "v" / "list.txt").write_text("ok_000001_000011.mp4 dance\n")
        args = [str(tmp_path / "v" / "list.txt"), str(tmp_path / "out"), "--classes", str(path)]
    line = {"csv": 3, "list": 3, "classes": 2}[kind]
    from .convert_helpers import run_cli

    r = run_cli(*args)
    assert r.returncode == 2, r.stderr
    what = {"csv": "CSV", "list": "list file", "classes": "class list"}[kind]
    assert r.stderr == (f"convert: error: {path}: line {line}: not valid UTF-8 (invalid continuation byte: byte "
                        f"b'\\xe9'); save the {what} as UTF-8\n")
    assert not os.path.exists(tmp_path / "out")


def test_files_that_are_no_regular_files_are_rejected_up_front_in_every_kind_of_source(touch_video, tmp_path):
    """Issue 19, point 5: a FIFO named like a video is never opened (nothing would ever write into it)."""
    root = tmp_path / "v"
    touch_video(str(root / "a" / "ok_000001_000011.mp4"))
    os.mkfifo(root / "a" / "fifo_000001_000011.mp4")
    os.symlink(root / "nowhere.mp4", root / "a" / "dangling_000001_000011.mp4")
    src = from_folders(str(root))
    assert [it.id for it in src.items] == ["a/ok_000001_000011"]
    assert sorted((p.id, p.status, p.reason) for p in src.problems) == [
        ("a/dangling_000001_000011", "missing", "broken symbolic link"),
        ("a/fifo_000001_000011", "rejected", "not a regular file (a FIFO): never opened as a video")]
    lst = tmp_path / "list.txt"
    lst.write_text("a/ok_000001_000011.mp4 0\na/fifo_000001_000011.mp4 0\n")
    src = from_list(str(lst), str(root))
    assert [(p.id, p.status) for p in src.problems] == [("a/fifo_000001_000011", "rejected")]
    csv = tmp_path / "k.csv"
    csv.write_text(CSV_HEADER + "a,ok,1,11,train\na,fifo,1,11,train\n")
    src = from_csv(str(csv), str(root))
    assert [(p.id, p.status, p.reason) for p in src.problems] == [
        ("fifo_000001_000011", "rejected", "not a regular file (a FIFO): never opened as a video")]


def test_a_file_name_that_is_not_utf8_is_rejected_with_its_bytes_escaped_and_the_job_goes_on(touch_video, tmp_path):
    """Issue 19, point 7: such a name stopped the job at planning ("surrogates not allowed"), naming no file."""
    from .convert_helpers import run_cli

    root = tmp_path / "src"
    touch_video(str(root / "a" / "ok.mp4"))
    touch_video(str(root / "b" / "fine.mp4"))
    bad = os.path.join(os.fsencode(root / "a"), b"caf\xe9.mp4")
    shutil.copyfile(os.fsencode(root / "a" / "ok.mp4"), bad)
    os.makedirs(os.path.join(os.fsencode(root / "b"), b"d\xffr"))
    shutil.copyfile(os.fsencode(root / "a" / "ok.mp4"), os.path.join(os.fsencode(root / "b"), b"d\xffr", b"v.mp4"))
    out = str(tmp_path / "out")
    r = run_cli(str(root), out, "--short", "loop", "--workers", "1", "--no-progress")
    assert r.returncode == 0, r.stderr
    report = {p["id"]: p for p in map(json.loads, open(os.path.join(out, "report.jsonl"))) if p["status"] != "padded"}
    assert report == {
        "a/caf\\xe9": {"id": "a/caf\\xe9", "path": f"{root}/a/caf\\xe9.mp4", "status": "rejected",
                       "reason": "file name is not valid UTF-8 (shown with its bytes escaped); rename it"},
        "b/d\\xffr/": {"id": "b/d\\xffr/", "path": f"{root}/b/d\\xffr", "status": "rejected",
                       "reason": "folder name is not valid UTF-8 (shown with its bytes escaped): the videos in "
                                 "it are not converted; rename it"}}
    assert json.load(open(os.path.join(out, "manifest.json")))["status_counts"] == {"padded": 2, "rejected": 2}


def test_csv_with_a_byte_order_mark_reads_as_without_one(tmp_path):
    """A spreadsheet's "CSV UTF-8" starts with a byte-order mark, which was read as part of the first column's
    name: the CSV seemed to lack its ``label`` column (issue 40), for the conversion and ``inspect --against``
    alike. A list file's first path had it too. (The index of a video root looks at names only.)"""
    from convert.tools import annotated_videos

    root = tmp_path / "videos"
    root.mkdir()
    (root / "abc_000010_000020.mp4").write_bytes(b"x")
    text = CSV_HEADER + "abseiling,abc,10,20,train\nabseiling,bad,x,1,train\n"
    plain, marked = tmp_path / "plain.csv", tmp_path / "marked.csv"
    plain.write_text(text)
    marked.write_bytes(b"\xef\xbb\xbf" + text.encode())
    got = from_csv(str(marked), str(root))
    assert [it.id for it in got.items] == ["abc_000010_000020"]
    assert [p.reason for p in got.problems] == ["line 3: time_start 'x' is not a number"]  # its lines as they are
    assert got.classes == from_csv(str(plain), str(root)).classes == ["abseiling"]
    assert annotated_videos(str(marked)) == annotated_videos(str(plain)) == {"abc_000010_000020": "abseiling"}
    (root / "list.txt").write_bytes(b"\xef\xbb\xbfabc_000010_000020.mp4 0\n")
    assert [it.id for it in from_list(str(root / "list.txt")).items] == ["abc_000010_000020"]


def test_csv_rows_that_label_one_video_differently_are_named_by_their_lines(tmp_path):
    """Issue 40: the last row won without a word. ``inspect --against`` refuses the list in one line naming the
    file and both lines (its counts would depend on which row is right); the conversion converts neither row
    and reports them; a row repeated with its label is the one video in both."""
    from convert.tools import annotated_videos

    root = tmp_path / "videos"
    root.mkdir()
    for name in ("abc_000010_000020", "def_000000_000010", "xyz_000000_000010"):
        (root / f"{name}.mp4").write_bytes(b"x")
    csv = tmp_path / "k.csv"
    csv.write_text(CSV_HEADER + "run,abc,10,20,train\nswim,def,0,10,train\nswim,def,0,10,train\n"
                   "jump,xyz,0,10,train\nrun,xyz,0,10,val\nswim,abc,10,20,train\n")
    with pytest.raises(SourceError) as caught:
        annotated_videos(str(csv))
    assert str(caught.value) == (f"{csv}: lines 5 and 6 both name video xyz_000000_000010, labelled 'jump' and "
                                 f"'run' (and 1 more video(s) labelled twice): the comparison would be "
                                 f"ambiguous; keep one label per video")
    # Within a split only its rows count: xyz's val row is another split's.
    with pytest.raises(SourceError, match=r"k.csv: lines 2 and 7 both name video abc_000010_000020, labelled "
                                          r"'run' and 'swim': the comparison would be ambiguous"):
        annotated_videos(str(csv), split="train")
    assert annotated_videos(str(csv), split="val") == {"xyz_000000_000010": "run"}
    src = from_csv(str(csv), str(root), split="train")
    assert [(it.id, src.classes[it.label]) for it in src.items] == [("def_000000_000010", "swim"),
                                                                      ("xyz_000000_000010", "jump")]
    assert [(p.id, p.status, p.reason) for p in src.problems] == [
        ("abc_000010_000020", "rejected", "lines 2 and 7 both name video abc_000010_000020, labelled 'run' and "
                                          "'swim': which one is right is not known"),
        ("def_000000_000010", "rejected", "duplicate video id")]
