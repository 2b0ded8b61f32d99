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
    (data,) = [f["name"] for f in json.load(open(os.path.join(out, "manifest.json")))["shard_files"][name]
               if f["name"] == "data.mdb"]  # beside its index file
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


def _plan_replaced(out: str, plan: bytes, *, record: bool) -> None:
    """plan.json replaced by ``plan``; with ``record`` the manifest's record of it follows, as if the job had
    written that plan."""
    from convert.format.manifest import PlanRecord

    with open(os.path.join(out, "plan.json"), "wb") as f:
        f.write(plan)
    if record:
        path = os.path.join(out, "manifest.json")
        m = json.load(open(path))
        m["plan"] = PlanRecord.of_file(os.path.join(out, "plan.json"), m["plan"]["shards"]).to_dict()
        json.dump(m, open(path, "w"))


def test_a_plan_larger_than_any_other_metadata_file_may_be_opens_and_verifies(raw_root, tmp_path):
    """Kinetics-700's plan is larger than MAX_JSON_BYTES: the manifest records it, so readers open the conversion
    without reading it, and verify checks its checksum."""
    from convert.format.layout import MAX_JSON_BYTES

    out = copy_conversion(raw_root, str(tmp_path / "c"))
    plan = open(os.path.join(out, "plan.json"), "rb").read()
    _plan_replaced(out, plan + b" " * (MAX_JSON_BYTES + 1 - len(plan)), record=True)
    assert os.path.getsize(os.path.join(out, "plan.json")) > MAX_JSON_BYTES
    assert len(open_clips(out)) == len(open_clips(raw_root))
    assert verify(out)[0] == []


def test_opening_does_not_parse_the_plan_and_verify_finds_it_changed(raw_root, tmp_path, monkeypatch):
    """A plan of the recorded size that is no JSON at all opens (the reader never parses it); verify compares its
    SHA-256 with the manifest's record and says the plan changed; a plan of another size is refused at open."""
    import convert.format.manifest as manifest_module

    out = copy_conversion(raw_root, str(tmp_path / "c"))
    size = os.path.getsize(os.path.join(out, "plan.json"))
    _plan_replaced(out, b"\0" * size, record=False)

    read = manifest_module.read_json_file

    def refuse_the_plan(path, what, **kwargs):
        assert what != "plan", "plan.json parsed"
        return read(path, what, **kwargs)

    monkeypatch.setattr(manifest_module, "read_json_file", refuse_the_plan)
    assert len(open_clips(out)) == len(open_clips(raw_root))
    monkeypatch.undo()
    problems, _ = verify(out)
    assert [p for p in problems if "plan.json: the plan changed since the manifest was written (its SHA-256" in p]
    _plan_replaced(out, b"{}", record=False)
    with pytest.raises(FormatError, match=rf"plan.json: the plan changed since the manifest was written \(2 bytes, "
                                          rf"the manifest's plan {size}\)"):
        open_clips(out)


def test_a_manifest_that_does_not_record_its_plan_is_checked_against_the_parsed_plan(raw_root, tmp_path,
                                                                                        monkeypatch):
    """Conversions written before the manifest recorded its plan: the plan is parsed, up to its own limit (larger
    than other metadata files'), and a longer one is one line naming it."""
    import convert.format.manifest as manifest_module

    def older(m):
        del m["plan"]
        _drop_last_shard(m)

    out = _tampered(raw_root, tmp_path, older)
    with pytest.raises(FormatError, match="the plan has 3 shards, the manifest lacks shard-00002"):
        open_clips(out)
    monkeypatch.setattr(manifest_module, "MAX_PLAN_BYTES", 100)
    with pytest.raises(FormatError, match=r"plan.json: the plan is more than the 100 bytes a plan may have$"):
        open_clips(out)
