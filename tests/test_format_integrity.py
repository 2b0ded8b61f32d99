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
