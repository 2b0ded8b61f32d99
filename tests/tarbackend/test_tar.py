"""The tar test backend's own promises, beyond the contract suites it runs through (tests/backend_params.py):
a killed write reruns to the same bytes, and a damaged shard is one line naming the shard and the clip."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from convert.format import FormatError
from convert.store.verify import verify
from loaders import open_clips

from ..test_convert_storage import _meta, _producer, _write_shard
from ..train_fixtures import tiny_as, tiny_data  # noqa: F401
from . import BACKEND
from .files import DATA_FILE, INDEX_FILE, read_index
from .writer import TarWriter

VIDEOS = {"a": 2, "b": 0, "c": 3, "d": 1}  # b: a record without clips


def _files(path: str) -> dict[str, bytes]:
    return {name: open(os.path.join(path, name), "rb").read() for name in (DATA_FILE, INDEX_FILE)}


def test_a_write_killed_mid_video_reruns_to_the_bytes_of_a_clean_write(tmp_path):
    """What a kill leaves (a video's members appended past the committed length, an index being written) is cut
    off when the shard is reopened: the rerun's archive and index are those of a write never interrupted."""
    clean = str(tmp_path / "clean")
    _write_shard(clean, "tar", None, VIDEOS)
    path = str(tmp_path / "killed")
    writer = BACKEND.writer(path=path, codec="raw", meta=_meta(), options=None)
    assert isinstance(writer, TarWriter)
    writer.write_video("a", 0, _producer(2, "a"), 4096)
    writer.write_video("b", 0, _producer(0, "b"), 4096)
    committed = os.path.getsize(os.path.join(path, DATA_FILE))
    fh = writer._fh
    assert fh is not None  # open since the first video
    fh.write(b"\x07" * 3000)  # the members of a video in flight
    fh.flush()
    open(os.path.join(path, INDEX_FILE + ".tmp.99999"), "w").write("{")  # its commit, cut short
    fh.close()  # the process dies: no close(), no finish()
    assert os.path.getsize(os.path.join(path, DATA_FILE)) == committed + 3000
    assert set(_write_shard(path, "tar", None, VIDEOS)) >= {"sha256", "clips"}
    assert _files(path) == _files(clean)
    # Reopened once finished, with nothing to add: the same bytes again (the end marker is not cut off).
    assert _write_shard(path, "tar", None, VIDEOS) == _write_shard(clean, "tar", None, VIDEOS)
    assert _files(path) == _files(clean)


@pytest.fixture()
def tar_copy(tiny_data, tmp_path) -> str:  # noqa: F811
    return shutil.copytree(tiny_as("tar", tiny_data), str(tmp_path / "copy"))


def _first_clip(root: str) -> tuple[str, str, int, int]:
    """(shard folder, video id, offset, size) of the first clip of the first shard."""
    shard = os.path.join(root, json.load(open(os.path.join(root, "manifest.json")))["shards"][0]["path"])
    index = read_index(shard)
    (vid, clip), (offset, size) = min(index.entries.items(), key=lambda item: item[1])
    assert clip == 0
    return shard, vid, offset, size


def _flip(path: str, at: int) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x20]))


def test_a_flipped_payload_byte_is_one_line_naming_the_shard_and_the_clip(tar_copy):
    shard, vid, offset, size = _first_clip(tar_copy)
    _flip(os.path.join(shard, DATA_FILE), offset + size - 1)  # the payload's last byte
    store = open_clips(tar_copy)
    index = next(i for i in range(len(store)) if store.refs([i])[1][0] == (vid, 0))
    with pytest.raises(FormatError) as err:
        store.get(index, verify=True)  # the payload's CRC-32 checked
    assert "\n" not in str(err.value) and shard in str(err.value) and f"{vid} clip 0" in str(err.value)
    problems, _ = verify(tar_copy)
    named = [p for p in problems if f"{vid} clip 0" in p]
    assert len(named) == 1 and shard in named[0] and "crc32" in named[0] and "\n" not in named[0], problems


def test_a_damaged_member_header_and_a_cut_archive_are_caught(tar_copy):
    shard, vid, offset, _ = _first_clip(tar_copy)
    data = os.path.join(shard, DATA_FILE)
    _flip(data, offset - 512 + 10)  # inside the member's name: its header checksum no longer holds
    problems, _ = verify(tar_copy)
    assert any(f"{data}: member 0 at byte 0: not a tar header" in p for p in problems), problems
    os.truncate(data, offset + 100)  # cut inside the first clip
    with pytest.raises(FormatError) as err:
        open_clips(tar_copy)[0]
    assert "\n" not in str(err.value) and f"{data}: {offset + 100} bytes, its index commits" in str(err.value)
