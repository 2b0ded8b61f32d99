"""A manifest edited by hand, or paired with the wrong shards, is caught by verify and refused by readers."""

from __future__ import annotations

import json
import os

import pytest

from convert.format import FormatError
from convert.store.verify import verify
from loaders import open_clips

from .loaders_fixtures import copy_conversion, loader_base, raw_root  # noqa: F401


def _tampered(root: str, tmp_path, change) -> str:
    out = copy_conversion(root, str(tmp_path / "c"))
    path = os.path.join(out, "manifest.json")
    manifest = json.load(open(path))
    change(manifest)
    json.dump(manifest, open(path, "w"))
    return out


def _swap_classes(m):
    m["classes"][0], m["classes"][1] = m["classes"][1], m["classes"][0]


def _append_class(m):
    m["classes"].append("extra")
    m["num_classes"] += 1


def _drop_last_shard(m):
    last = m["shards"].pop()
    for k in ("videos", "clips", "value_bytes"):
        m["totals"][k] -= last[k]


def _swap_shards(m):
    m["shards"][0], m["shards"][1] = m["shards"][1], m["shards"][0]


CASES = {
    "swapped class names": (_swap_classes, "shard says classes"),
    "an appended class": (_append_class, "shard says classes"),
    "num_classes changed": (lambda m: m.update(num_classes=m["num_classes"] + 1), "num_classes 6 but 5 class names"),
    "codec changed": (lambda m: m.update(codec="jpeg", codec_id=2), "shard says codec"),
    "last shard dropped, totals adjusted": (_drop_last_shard, "the plan has 3 shards, the manifest lacks shard-00002"),
    "two shards swapped": (_swap_shards, "the plan has 3 shards, the manifest lists them in another order"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_tampered_manifest_fails_verify_and_readers(raw_root, tmp_path, case):
    change, words = CASES[case]
    out = _tampered(raw_root, tmp_path, change)
    problems, _ = verify(out)
    assert any(words in p for p in problems), problems
    with pytest.raises(FormatError, match=words):
        open_clips(out)


def test_without_the_plan_the_shards_own_metadata_still_catch_a_dropped_or_moved_shard(raw_root, tmp_path):
    out = _tampered(raw_root, tmp_path, _drop_last_shard)
    os.remove(os.path.join(out, "plan.json"))
    with pytest.raises(FormatError, match="belongs to a conversion of 3 shards, the manifest lists 2"):
        open_clips(out)
    out = _tampered(raw_root, tmp_path / "b", _swap_shards)
    os.remove(os.path.join(out, "plan.json"))
    with pytest.raises(FormatError, match="shard is number 1 of its conversion, the manifest lists it as number 0"):
        open_clips(out)
    assert any("reordered" in p for p in verify(out)[0])


def test_a_shard_file_changed_where_no_clip_lies_is_caught_by_its_listed_checksum(raw_root, tmp_path):  # noqa: F811
    """The manifest lists each shard's files with their sizes and SHA-256 (format version 3): verify, and the shard
    cache on arrival, refuse a copy whose bytes differ even where no clip, record or checksum of the format lies
    (the end of an LMDB file, past its last page in use)."""
    from convert.store.cache import CacheSettings

    out = copy_conversion(raw_root, str(tmp_path / "c"))
    name = json.load(open(os.path.join(out, "manifest.json")))["shards"][0]["name"]
    (data,) = [f["name"] for f in json.load(open(os.path.join(out, "manifest.json")))["shard_files"][name]]
    path = os.path.join(out, "shards", name, data)
    with open(path, "r+b") as f:
        f.seek(-1, os.SEEK_END)
        last = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last[0] ^ 0xFF]))
    problems = verify(out)[0]
    assert [p for p in problems if "checksum" in p] == [p for p in problems if p.startswith(f"{name}: file {data}: "
                                                                                             "checksum ")], problems
    assert len(problems) == 1, problems
    with pytest.raises(FormatError) as err:
        store = open_clips(f"file://{out}", cache=CacheSettings(cache_dir=str(tmp_path / "cache")))
        for i in range(len(store)):
            store.get(i)
    assert "\n" not in str(err.value) and f"file {data}: checksum" in str(err.value) and "on arrival" in str(err.value)
