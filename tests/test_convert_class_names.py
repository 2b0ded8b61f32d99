"""Class names hold no control characters, and ``inspect`` prints every name escaped."""

from __future__ import annotations

import csv
import io
import os
import shutil

import pytest

from convert.worker.sources import SourceError, from_folders, from_list, printable

from .convert_helpers import run_cli

TAIL = "class names are printed, and given back one a line through --classes: take it out of the name"


@pytest.mark.parametrize("label, line, bad", [("\x1b[31mred", 3, "'\\x1b'"), ("a\nb", 4, "'\\n'")])
def test_a_csv_label_with_a_control_character_is_refused_in_one_line_naming_the_csv_and_line(
        touch_video, tmp_path, label, line, bad):
    """An escape sequence in a label reached the terminal through ``inspect``; "a\\nb" was a class that
    ``--classes`` could never give back."""
    touch_video(str(tmp_path / "v" / "ok_000001_000011.mp4"))
    text = io.StringIO()
    rows = [["label", "youtube_id", "time_start", "time_end", "split"], ["dance", "ok", "1", "11", "train"],
            [label, "ok", "1", "11", "val"]]
    csv.writer(text, lineterminator="\n").writerows(rows)  # quotes the label holding a newline
    path = tmp_path / "k.csv"
    path.write_text(text.getvalue())
    r = run_cli(str(path), str(tmp_path / "out"), "--videos", str(tmp_path / "v"), "--split", "train")
    assert r.returncode == 2, r.stderr
    escaped = "'\\x1b[31mred'" if label.startswith("\x1b") else "'a\\nb'"
    assert r.stderr == (f"convert: error: {path}: line {line}: label {escaped} holds a control character ({bad}); "
                        f"{TAIL}\n")
    assert not os.path.exists(tmp_path / "out")


def test_control_characters_are_refused_in_folder_names_list_labels_and_the_class_list(touch_video, tmp_path):
    root = tmp_path / "src"
    touch_video(str(root / "ok" / "v.mp4"))
    touch_video(str(root / "tab\there" / "w.mp4"))
    with pytest.raises(SourceError) as info:
        from_folders(str(root))
    assert str(info.value) == f"{root}: class folder name 'tab\\there' holds a control character ('\\t'); {TAIL}"
    lst = root / "list.txt"
    lst.write_text("ok/v.mp4 fine\nok/v.mp4 bell\x07\n")
    with pytest.raises(SourceError) as info:
        from_list(str(lst))
    assert str(info.value) == f"{lst}: line 2: label 'bell\\x07' holds a control character ('\\x07'); {TAIL}"
    classes = tmp_path / "classes.txt"
    classes.write_text("fine\nnul\x00\n")
    lst.write_text("ok/v.mp4 fine\n")
    with pytest.raises(SourceError) as info:
        from_list(str(lst), classes_file=str(classes))
    assert str(info.value) == f"{classes}: line 2: class name 'nul\\x00' holds a control character ('\\x00'); {TAIL}"
    classes.write_text("fine\ndel\x7f\n")
    r = run_cli(str(lst), str(tmp_path / "out"), "--classes", str(classes))
    assert r.returncode == 2 and r.stderr == (f"convert: error: {classes}: line 2: class name 'del\\x7f' holds a "
                                              f"control character ('\\x7f'); {TAIL}\n")


def test_printable_escapes_what_a_terminal_would_act_on_and_keeps_the_rest():
    assert printable("\x1b[31mred\x1b[0m") == "\\x1b[31mred\\x1b[0m"
    assert printable("a\nb\r\tc\x00\x7f") == "a\\nb\\r\\tc\\x00\\x7f"
    assert printable("right\u202eleft\u2028") == "right\\u202eleft\\u2028"  # a direction override, a line separator
    assert printable("caf\udce9") == "caf\\udce9"  # a byte that was not UTF-8, as os.fsdecode keeps it
    assert printable("arm wrestling, café 'x' \"y\" 跳舞") == "arm wrestling, café 'x' \"y\" 跳舞"


def test_inspect_prints_class_names_escaped(touch_video, tmp_path):
    """A right-to-left override is no control character (planning keeps it), but is not printed raw."""
    root = tmp_path / "src"
    touch_video(str(root / "plain" / "v.mp4"))
    touch_video(str(root / "evil\u202etxt.exe" / "w.mp4"))
    out = str(tmp_path / "out")
    r = run_cli(str(root), out, "--short", "loop", "--workers", "1", "--no-progress")
    assert r.returncode == 0, r.stderr
    r = run_cli("inspect", out)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    i = lines.index("clips per class:")
    assert lines[i + 1:i + 3] == [f"  {1:8d}  evil\\u202etxt.exe", f"  {1:8d}  plain"]
    assert "\u202e" not in r.stdout
