"""A bucket is written by strangers: no name in it chooses a local path.

A manifest's shard ``name`` and ``path`` become the cache's lock, reservation,
index and shard paths, and the keys under a shard's prefix become the files
of its download. Each hostile value (absolute, ``..``, ``//``, a backslash,
NUL, an overlong name) is refused in one line naming the URL by the library,
``verify`` and ``train``, and nothing is written outside the cache folder;
objects a shard's backend does not declare (a key with ``..`` or ``//``, a
stale or temporary object) are neither downloaded nor counted.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from convert.format import FormatError
from convert.format.layout import MAX_NAME_BYTES, inside, plain_name, relative_path
from convert.store import open_clips
from convert.store.cache import CacheSettings
from train.main import main

from .remote_fixtures import cache_of
from .train_fixtures import common, one_line_error, tiny_data, tiny_tfrecord  # noqa: F401


def _settings(tmp_path) -> CacheSettings:
    return CacheSettings(cache_dir=str(tmp_path / "cache"), backoff=0.01, attempts=2, wait_s=5.0)


def _client():
    import boto3

    return boto3.client("s3")


def _put(bucket: str, key: str, body: bytes) -> None:
    """An object under exactly ``key`` (s3fs would normalise ``..`` and ``//`` away; a stranger's client does not)."""
    _client().put_object(Bucket=bucket, Key=key, Body=body)


def _files_under(folder) -> set[str]:
    return {os.path.relpath(os.path.join(d, n), folder) for d, _, names in os.walk(folder) for n in names}


def _victim(tmp_path) -> str:
    """A file of the user's outside every folder the test gives the reader: it must stay as it is."""
    victim = tmp_path / "home" / "victim"
    victim.parent.mkdir(parents=True)
    victim.write_bytes(b"precious")
    return str(victim)


def _hostile_names(victim: str) -> dict[str, tuple[str, str, str]]:
    """case -> (field, value, words of the refusal)."""
    return {
        "absolute name": ("name", victim, "holds '/'"),
        "dotdot name": ("name", "..", "starts with '.'"),
        "climbing name": ("name", "../../../home/victim", "holds '/'"),
        "backslash name": ("name", "shard\\..\\x", "holds '\\\\'"),
        "nul name": ("name", "shard\x00x", "holds '\\x00'"),
        "overlong name": ("name", "s" * (MAX_NAME_BYTES + 1), f"more than {MAX_NAME_BYTES}"),
        "absolute path": ("path", victim, "leaves the conversion folder"),
        "climbing path": ("path", "shards/../../home", "starts with '.'"),
        "empty segment path": ("path", "shards//shard-00000", "empty segment"),
        "backslash path": ("path", "shards/a\\..\\..\\x", "holds '\\\\'"),
        "nul path": ("path", "shards/a\x00", "holds '\\x00'"),
        "shared name": ("name", "@shard-00001", "is another shard's too"),
    }


CASES = list(_hostile_names("/v"))


@pytest.mark.parametrize("case", CASES)
def test_a_hostile_shard_name_or_path_is_refused_by_the_library_verify_and_train(s3_server, tiny_data, tmp_path,
                                                                                 capsys, case):
    from convert.tools import main as tools_main

    victim = _victim(tmp_path)
    field, value, words = _hostile_names(victim)[case]
    fs = s3_server.fs()
    bucket = s3_server.bucket()
    url = s3_server.upload(tiny_data, bucket)
    manifest = json.loads(fs.cat_file(f"{bucket}/data/manifest.json"))
    if value.startswith("@"):  # another shard's name
        value = manifest["shards"][1]["name"]
    manifest["shards"][0][field] = value
    _put(bucket, "data/manifest.json", json.dumps(manifest).encode())
    where = f"{url}/manifest.json"

    with pytest.raises(FormatError) as err:
        open_clips(url, cache=_settings(tmp_path))
    msg = str(err.value)
    assert "\n" not in msg and where in msg and words in msg, msg

    code = tools_main(["verify", url, "--cache-dir", str(tmp_path / "cache")])
    out, err_text = capsys.readouterr()
    lines = (out + err_text).strip().splitlines()
    assert code != 0 and len(lines) == 1 and where in lines[0] and words in lines[0], lines

    assert main(common(url, tmp_path / "run") + ["--cache-dir", str(tmp_path / "cache"), "--max-steps", "1"]) != 0
    msg = one_line_error(capsys)
    assert where in msg and words in msg, msg

    # Nothing beside the victim, the victim as it was, nothing of the cache's outside its folder.
    assert sorted(os.listdir(os.path.dirname(victim))) == ["victim"]
    with open(victim, "rb") as f:
        assert f.read() == b"precious"
    assert _files_under(tmp_path) <= {os.path.relpath(victim, tmp_path)} | {
        p for p in _files_under(tmp_path) if p.startswith(("cache/", "run/"))}


@pytest.mark.parametrize("root", ["tiny_data", "tiny_tfrecord"])
def test_objects_the_backend_does_not_declare_are_neither_downloaded_nor_counted(s3_server, tmp_path, request,
                                                                                 root):
    """Keys with ``..`` or ``//`` under a shard's prefix, a killed upload's temporary, an unknown file: whoever can
    add an object to the bucket writes nothing on the reader's machine, and reading goes on normally."""
    local = request.getfixturevalue(root)
    bucket = s3_server.bucket()
    url = s3_server.upload(local, bucket)
    reference = open_clips(local)
    shard = reference.manifest.shards[0].path
    planted = [f"data/{shard}/../../../../../escaped", f"data/{shard}//doubled", f"data/{shard}/sub/../../up",
               f"data/{shard}/data.mdb.tmp-123", f"data/{shard}/part-00000.tfrecord.tmp-9", f"data/{shard}/notes.txt",
               f"data/{shard}/.hidden"]
    for key in planted:
        _put(bucket, key, b"planted by a stranger")
    store = open_clips(url, cache=_settings(tmp_path))
    try:
        assert len(store) == len(reference)
        for i in range(len(store)):
            a, b = store.get(i, verify=True), reference.get(i)
            assert a.video_id == b.video_id and np.array_equal(a.clip, b.clip)
        listed = set(cache_of(store).files[0])
        assert not any(name in k for k in listed for name in ("escaped", "doubled", "up", "tmp", "notes", "hidden"))
        assert cache_of(store).sizes[0] == sum(os.path.getsize(os.path.join(local, shard, f)) for f in listed)
    finally:
        store.close()
    found = [p for p in _files_under(tmp_path) | _files_under(os.path.dirname(str(tmp_path)))
             if os.path.basename(p) in ("escaped", "doubled", "up")]
    assert found == []


@pytest.mark.parametrize("value, words", [
    ("", "is not a file name"), (".", "starts with '.'"), ("..", "starts with '.'"), ("a/b", "holds '/'"),
    ("a\\b", "holds '\\\\'"), ("a\x00b", "holds '\\x00'"), ("a\nb", "holds '\\n'"), ("x" * 161, "more than 160"),
    (7, "is not a file name"),
])
def test_plain_name_refuses_in_one_line(value, words):
    with pytest.raises(FormatError) as err:
        plain_name(value, "name", "s3://b/manifest.json")
    assert "\n" not in str(err.value) and words in str(err.value) and "s3://b/manifest.json" in str(err.value)


@pytest.mark.parametrize("value", ["/abs", "a//b", "a/", "../a", "a/./b", "a/../b", "a\\b"])
def test_relative_path_refuses_what_leaves_its_folder(value):
    with pytest.raises(FormatError):
        relative_path(value, "path", "here")


def test_inside_resolves_links_before_comparing(tmp_path):
    (tmp_path / "box").mkdir()
    (tmp_path / "box" / "out").symlink_to(tmp_path)
    assert inside(str(tmp_path / "box"), "a/b", "w") == str(tmp_path / "box" / "a" / "b")
    for rel in ("out/x", "..", "../x", "."):
        with pytest.raises(FormatError, match="would lie outside"):
            inside(str(tmp_path / "box"), rel, "w")


# -- a URL that names no place, a manifest that is not one ------------------------------------------------------


@pytest.mark.parametrize("url", ["s3://", "s3:///data", "gs://", "file://"])
def test_a_url_without_a_bucket_or_host_is_one_line_and_writes_nothing(synth_videos, tmp_path, url):
    import subprocess
    import sys

    from .conftest import ROOT

    with pytest.raises(ValueError) as err:
        open_clips(url, cache=_settings(tmp_path))
    assert "\n" not in str(err.value) and ("no bucket or host" in str(err.value) or "no path" in str(err.value))
    work = tmp_path / "cwd"
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": ROOT}
    got = subprocess.run([sys.executable, "-m", "convert", synth_videos, url], cwd=work, env=env,
                         capture_output=True, text=True, timeout=120)
    assert got.returncode == 2 and got.stderr.count("\n") == 1, got.stderr
    assert got.stderr.startswith(f"convert: error: {url}"), got.stderr
    assert os.listdir(work) == []  # no ./s3: folder
    for cmd in ("verify", "inspect"):
        got = subprocess.run([sys.executable, "-m", "convert", cmd, url], cwd=work, env=env, capture_output=True,
                             text=True, timeout=120)
        assert got.returncode == 2 and got.stderr.count("\n") == 1 and url in got.stderr, got.stderr
    assert os.listdir(work) == []


def test_a_remote_manifest_nested_without_end_is_one_line(s3_server, tiny_data, tmp_path, capsys):
    from convert.tools import main as tools_main

    bucket = s3_server.bucket()
    url = s3_server.upload(tiny_data, bucket)
    _put(bucket, "data/manifest.json", b"[" * 200_000 + b"]" * 200_000)
    where = f"{url}/manifest.json"
    with pytest.raises(FormatError) as err:
        open_clips(url, cache=_settings(tmp_path))
    assert "\n" not in str(err.value) and str(err.value).startswith(where) and "RecursionError" in str(err.value)
    assert tools_main(["verify", url, "--cache-dir", str(tmp_path / "cache")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and where in lines[0] and "not valid JSON" in lines[0], lines
    assert main(common(url, tmp_path / "run") + ["--cache-dir", str(tmp_path / "cache"), "--max-steps", "1"]) != 0
    assert where in one_line_error(capsys)


def test_a_remote_manifest_over_the_size_cap_is_refused_without_reading_it_whole(s3_server, tiny_data, tmp_path,
                                                                                 monkeypatch):
    """The cap a local manifest has (MAX_JSON_BYTES, 64 MiB): at most one byte more is read. Scaled down here."""
    import convert.store.remote as remote

    monkeypatch.setattr(remote, "MAX_JSON_BYTES", 1 << 20)
    bucket = s3_server.bucket()
    url = s3_server.upload(tiny_data, bucket)
    _put(bucket, "data/manifest.json", b" " * (3 << 20) + b"{}")
    reads: list[int] = []
    original = remote.Remote.read_bytes

    def counted(self, rel, *, limit=None):
        data = original(self, rel, limit=limit)
        reads.append(len(data))
        return data

    monkeypatch.setattr(remote.Remote, "read_bytes", counted)
    with pytest.raises(FormatError) as err:
        open_clips(url, cache=_settings(tmp_path))
    assert "\n" not in str(err.value) and f"{url}/manifest.json" in str(err.value)
    assert "more than the 1048576 bytes" in str(err.value)
    assert reads == [(1 << 20) + 1]


@pytest.mark.parametrize("case", ["nested", "huge"])
def test_a_bad_manifest_is_the_same_one_line_through_a_url_as_from_a_folder(tiny_data, tmp_path, case):
    """One reader of a remote manifest with the local reader's guards: a manifest nested without end, or longer
    than MAX_JSON_BYTES, gives the folder's one-line error through file:// (the cache's open and ``manifest_at``
    alike), naming the URL instead of the path."""
    import shutil

    from convert.format.layout import MAX_JSON_BYTES
    from convert.store import manifest_at

    folder = str(tmp_path / "data")
    shutil.copytree(tiny_data, folder)
    path = os.path.join(folder, "manifest.json")
    if case == "nested":
        with open(path, "wb") as f:
            f.write(b"[" * 200_000 + b"]" * 200_000)
    else:
        with open(path, "wb") as f:
            f.truncate(MAX_JSON_BYTES + 10)  # sparse: nothing is written, and the reader reads no more than the cap
    url = f"file://{folder}"
    errors = []
    for root, read in ((folder, lambda r: open_clips(r)), (url, lambda r: open_clips(r, cache=_settings(tmp_path))),
                       (url, manifest_at)):
        with pytest.raises(FormatError) as err:
            read(root)
        errors.append(str(err.value).replace(f"{url}/manifest.json", path))
    assert errors[0] == errors[1] == errors[2], errors
    assert "\n" not in errors[0] and errors[0].startswith(path + ": the manifest is ")


@pytest.mark.parametrize("listed, words", [
    ("evil.txt", "shard_files lists 'evil.txt' for shard {shard}, which is no file of its backend's shards"),
    ("lock.mdb", "shard_files lists 'lock.mdb' for shard {shard}, which is no file of its backend's shards"),
    ("data.mdb", "shard_files[\"{shard}\"]: file 'data.mdb' is listed twice"),
], ids=["a stranger's file", "the database's lock", "a data file twice"])
def test_a_manifest_listing_other_files_than_the_backends_is_refused_before_anything_is_copied(
        tiny_data, tmp_path, listed, words):
    """Issue 40: names in a remote manifest's ``shard_files`` that are not the backend's files were copied into
    the cache's shard folder (FORMAT.md: the list holds exactly them). Refused in one line naming the manifest,
    the shard and the name when the manifest is read, before the cache holds anything of the shard; and by an
    upload of a local conversion so listed, which would copy them to the bucket."""
    import hashlib
    import shutil

    from convert.store import manifest_at
    from convert.store.upload import upload_conversion

    folder = tmp_path / "data"
    shutil.copytree(tiny_data, folder)
    path = folder / "manifest.json"
    manifest = json.loads(path.read_text())
    shard = manifest["shards"][0]
    body = b"planted by a stranger"
    if listed != "data.mdb":
        (folder / shard["path"] / listed).write_bytes(body)  # there to be copied, as a stranger would put it
    manifest["shard_files"][shard["name"]].append({"name": listed, "bytes": len(body),
                                                   "sha256": hashlib.sha256(body).hexdigest()})
    path.write_text(json.dumps(manifest))
    url = f"file://{folder}"
    for read in (lambda: open_clips(url, cache=_settings(tmp_path)), lambda: manifest_at(url)):
        with pytest.raises(FormatError) as err:
            read()
        msg = str(err.value)
        assert "\n" not in msg and msg.startswith(f"{url}/manifest.json: "), msg
        assert words.format(shard=shard["name"]) in msg, msg
    assert not any(listed in p for p in _files_under(tmp_path / "cache"))
    if listed != "data.mdb":  # the parser refuses a name twice for a local conversion too
        with pytest.raises(FormatError, match=f"lists '{listed}' for shard {shard['name']}"):
            upload_conversion(str(folder), f"file://{tmp_path / 'bucket'}")
        assert not any(listed in p for p in _files_under(tmp_path / "bucket"))


# -- the cache's own disk -----------------------------------------------------------------------------------------


def _mount(path: str, options: str) -> bool:
    import subprocess

    os.makedirs(path, exist_ok=True)
    try:
        return subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", path], capture_output=True,
                              timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


_OPEN_ALL = """
import sys
from convert.store import open_clips
from convert.store.cache import CacheSettings
from convert.store.remote import RemoteError
try:
    store = open_clips(sys.argv[1], cache=CacheSettings(cache_dir=sys.argv[2], limit=1 << 30, attempts=1))
    for i in range(len(store)):
        store.get(i)
except RemoteError as exc:
    print(exc)
"""


@pytest.mark.parametrize("case", ["no inodes", "read-only", "another user's"])
def test_a_cache_disk_problem_is_one_line_naming_the_folder_and_the_cause(s3_server, tiny_data, tmp_path, capsys,
                                                                           case):
    """Not a full disk of bytes: a file system out of inodes, remounted read-only, or a folder of another user.
    The library, ``verify`` and ``train`` each say it in one line naming the cache folder and the real cause
    (never bytes, for inodes)."""
    import subprocess
    import sys

    from convert.tools import main as tools_main

    from .conftest import ROOT
    from .train_fixtures import subprocess_env

    url = s3_server.upload(tiny_data, s3_server.bucket())
    disk = str(tmp_path / "disk")
    if case == "another user's":
        os.makedirs(disk)
        os.chown(disk, 12345, 12345)
        os.chmod(disk, 0o700)
        # Root ignores permission bits: the reader runs without the capabilities that let it.
        got = subprocess.run(["setpriv", "--bounding-set=-dac_override,-dac_read_search", sys.executable, "-c",
                              _OPEN_ALL, url, disk], cwd=ROOT, env=subprocess_env(), capture_output=True, text=True,
                             timeout=120)
        assert got.returncode == 0 and got.stderr == "", got.stderr
        line = got.stdout.strip()
        assert "\n" not in line and f"the shard cache {disk}" in line and "owned by uid 12345" in line, line
        return
    options = "size=20m,nr_inodes=6" if case == "no inodes" else "size=20m"
    if not _mount(disk, options):
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        if case == "read-only":
            assert subprocess.run(["mount", "-o", "remount,ro", disk], timeout=30).returncode == 0
        words = "no free inodes" if case == "no inodes" else "read-only"
        cache = ["--cache-dir", disk, "--cache-limit", "1000000000"]
        with pytest.raises(OSError) as err:
            store = open_clips(url, cache=CacheSettings(cache_dir=disk, limit=10**9, attempts=1))
            for i in range(len(store)):
                store.get(i)
        msg = str(err.value)
        assert "\n" not in msg and disk in msg and words in msg, msg
        assert tools_main(["verify", url, *cache]) == 1
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and disk in lines[0] and words in lines[0], lines
        assert main(common(url, tmp_path / "run") + cache + ["--max-steps", "1"]) != 0
        msg = one_line_error(capsys)
        assert disk in msg and words in msg, msg
    finally:
        subprocess.run(["umount", "-l", disk], capture_output=True, timeout=30)


# -- a URL that held another conversion ---------------------------------------------------------------------------


def _multipart_put(bucket: str, key: str, body: bytes) -> None:
    """``body`` uploaded in one part of a multipart upload: its ETag is then no MD5 ("<md5 of md5s>-1")."""
    s3 = _client()
    upload = s3.create_multipart_upload(Bucket=bucket, Key=key)
    part = s3.upload_part(Bucket=bucket, Key=key, UploadId=upload["UploadId"], PartNumber=1, Body=body)
    s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=upload["UploadId"],
                                 MultipartUpload={"Parts": [{"ETag": part["ETag"], "PartNumber": 1}]})


def test_an_upload_over_objects_of_the_same_size_compares_content_not_sizes(s3_server, tiny_data, tmp_path):
    """The URL holds another conversion whose shard files have the sizes of ours, uploaded in parts (an ETag
    that is no MD5), plus objects our shards do not have: the upload replaces the first, removes the others, and
    the URL then reads as the local folder."""
    from convert.store.cache.verify import verify_url
    from convert.store.upload import upload_conversion

    bucket = s3_server.bucket()
    url = s3_server.upload(tiny_data, bucket)
    store = open_clips(tiny_data)
    shard = store.manifest.shards[0].path
    size = os.path.getsize(os.path.join(tiny_data, shard, "data.mdb"))
    _multipart_put(bucket, f"data/{shard}/data.mdb", os.urandom(size))  # same size, other bytes
    assert _client().head_object(Bucket=bucket, Key=f"data/{shard}/data.mdb")["ETag"].strip('"').endswith("-1")
    for stale in (f"data/{shard}/data.mdb.tmp-4242", "data/shards/shard-09999/data.mdb"):
        _put(bucket, stale, b"stale")
    counts = upload_conversion(tiny_data, url)
    assert counts["uploaded"] >= 1 and counts["removed"] == 2
    problems, _ = verify_url(url, cache=_settings(tmp_path))
    assert problems == []
    keys = {o["Key"] for o in _client().list_objects_v2(Bucket=bucket)["Contents"]}
    assert not any("tmp-4242" in k or "shard-09999" in k for k in keys)
    again = upload_conversion(tiny_data, url)  # a rerun: everything is there, checked by content
    assert again["uploaded"] == 0 and again["removed"] == 0


def test_a_reader_open_across_an_overwrite_of_its_url_fails_in_one_line(s3_server, tiny_data, tmp_path):
    """Another process of the node opens the URL after it was overwritten, through the same cache: the mirror now
    holds the new conversion, and the old reader refuses to read on (or to add its own shards to the new mirror)."""
    bucket = s3_server.bucket()
    url = s3_server.upload(tiny_data, bucket)
    old = open_clips(url, cache=_settings(tmp_path))
    old.get(0)
    manifest = json.loads(s3_server.fs().cat_file(f"{bucket}/data/manifest.json"))
    manifest["created"] = "another conversion"
    _put(bucket, "data/manifest.json", json.dumps(manifest).encode())
    new = open_clips(url, cache=_settings(tmp_path))
    last = len(old) - 1
    assert old.shards_of(np.array([last]))[0] != old.shards_of(np.array([0]))[0]
    with pytest.raises(FormatError) as err:
        old.get(last)
    msg = str(err.value)
    assert "\n" not in msg and "changed since this reader opened it" in msg and url in msg, msg
    new.get(last)  # the new reader reads on
    old.close()
    new.close()


def test_what_killed_processes_left_in_the_cache_is_swept_at_open(s3_server, tiny_data, tmp_path):
    url = s3_server.upload(tiny_data, s3_server.bucket())
    store = open_clips(url, cache=_settings(tmp_path))
    store.get(0)
    cache_dir, shards = cache_of(store).dir, os.path.dirname(cache_of(store).local_path(0))
    names = [s.name for s in store.manifest.shards]
    store.close()
    dead = 2**22 + 12345  # above the default pid_max of 4M: no live process has it
    left = [os.path.join(shards, f".tmp-{names[1]}-{dead}-7"), os.path.join(shards, f".evict-{names[0]}-{dead}"),
            os.path.join(cache_dir, ".index", f".tmp-{names[2]}-{dead}-9")]
    for path in left:
        os.makedirs(path)
        with open(os.path.join(path, "data.mdb"), "wb") as f:
            f.write(b"x" * 1000)
    open_clips(url, cache=_settings(tmp_path)).close()
    assert [p for p in left if os.path.exists(p)] == []


def test_default_limits_of_two_urls_under_one_cache_root_share_its_disk(s3_server, tiny_data, tiny_tfrecord, tmp_path):
    """The default limit is DEFAULT_FRACTION of what the root's disk gives all its mirrors, less what the others
    hold: the second URL's limit plus the first's shards stay within that fraction of the disk."""
    import shutil
    import subprocess

    from convert.store.cache import DEFAULT_FRACTION

    disk = str(tmp_path / "disk")
    if not _mount(disk, "size=40m"):
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        settings = CacheSettings(cache_dir=disk, attempts=1)
        first = open_clips(s3_server.upload(tiny_data, s3_server.bucket()), cache=settings)
        for i in range(len(first)):
            first.get(i)
        held = cache_of(first).held_bytes()
        assert held > 0
        free = shutil.disk_usage(disk).free
        second = open_clips(s3_server.upload(tiny_tfrecord, s3_server.bucket()), cache=settings)
        own = os.path.join(cache_of(first).dir, "shards")
        on_disk = sum(os.path.getsize(os.path.join(d, n)) for d, _, ns in os.walk(own) for n in ns)
        # Within what the second mirror's own metadata took from the disk meanwhile.
        assert abs(cache_of(second).limit - (int((free + on_disk) * DEFAULT_FRACTION) - on_disk)) < 64 << 10
        assert cache_of(second).limit + held <= (free + held) * DEFAULT_FRACTION + (64 << 10)
        first.close()
        second.close()
    finally:
        subprocess.run(["umount", "-l", disk], capture_output=True, timeout=30)
