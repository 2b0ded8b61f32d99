"""Reading conversions from URLs through the shard cache, against a real S3 server and a real HTTP server.

Every clip read from ``s3://`` or ``http://`` equals the local folder's; a
damaged, truncated or missing object is caught on arrival with its URL; a
cache smaller than the data evicts only shards no reader holds and, read in
shard order, downloads each shard once; processes sharing one cache download
each shard once.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys

import numpy as np
import pytest

from convert.format import FormatError, ShardMissing
from convert.store import open_clips
from convert.store.cache import CacheFullError, CacheSettings, ShardCache
from convert.store.remote import RemoteError

from .backend_params import with_test_backends
from .conftest import REAL_CACHE_DIR, ROOT
from .remote_fixtures import cache_of, copy_conversion, serve_folder
from .train_fixtures import tiny_as, tiny_data, tiny_tfrecord


def _settings(tmp_path, **kw) -> CacheSettings:
    return CacheSettings(cache_dir=str(tmp_path / "cache"), backoff=0.01, attempts=2, wait_s=5.0, **kw)


def _same_clips(a, b) -> None:
    assert len(a) == len(b) and a.classes == b.classes
    for i in range(len(a)):
        x, y = a.get(i, verify=True), b.get(i)
        assert (x.label, x.video_id, x.clip_index) == (y.label, y.video_id, y.clip_index)
        assert np.array_equal(x.clip, y.clip), i


def _entries(folder: str) -> list[str]:
    """What ``folder`` holds, and what its ``staging`` folder (conversions to URLs) holds; [] when it is not."""
    out = []
    for sub in (folder, os.path.join(folder, "staging")):
        if os.path.isdir(sub):
            out += [os.path.join(sub, name) for name in os.listdir(sub)]
    return sorted(out)


def test_a_remote_read_with_the_default_cache_folder_writes_nothing_into_the_users_cache(
        s3_server, tiny_tfrecord, user_cache_dir):
    """The suite points XDG_CACHE_HOME at a temporary folder for every test (conftest.py), for this process and
    the processes it starts: a remote read that takes the default cache folder, here and in a child process,
    mirrors the URL there and writes nothing under the user's real ~/.cache/videoclips."""
    from convert.store.cache import default_cache_dir

    assert default_cache_dir() == user_cache_dir and os.path.realpath(REAL_CACHE_DIR) != os.path.realpath(
        user_cache_dir)
    bucket = s3_server.bucket()
    url = s3_server.upload(tiny_tfrecord, bucket)
    before = _entries(REAL_CACHE_DIR)
    store = open_clips(url)  # no cache settings: the default cache folder
    store.get(0)
    store.close()
    child = subprocess.run([sys.executable, "-c", "import sys; from convert.store import open_clips; "
                            "s = open_clips(sys.argv[1]); s.get(len(s) - 1); print(s.cache.dir)", url],
                           cwd=ROOT, capture_output=True, text=True, timeout=120,
                           env={**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")})
    assert child.returncode == 0, child.stderr
    mirrors = [e for e in _entries(user_cache_dir) if bucket in os.path.basename(e)]
    assert len(mirrors) == 1 and child.stdout.strip() == mirrors[0], (mirrors, child.stdout)
    # The real folder's new entries, of this test's bucket only: other programs of the machine may use the
    # real cache meanwhile.
    written = [e for e in _entries(REAL_CACHE_DIR) if e not in before and bucket in os.path.basename(e)]
    assert written == [], f"the suite wrote into the user's cache: {written}"


def test_s3_lmdb_reads_as_local(s3_server, tiny_data, tmp_path):
    url = s3_server.upload(tiny_data, s3_server.bucket())
    store = open_clips(url, cache=_settings(tmp_path))
    assert store.url == url and store.cache is not None
    _same_clips(store, open_clips(tiny_data))
    assert np.array_equal(store.storage_order(), open_clips(tiny_data).storage_order())
    assert sorted(cache_of(store).downloads()) == sorted(s.name for s in store.manifest.shards)
    store.close()
    # A second open (another rank, a resume) uses the cache's index and shards: nothing downloaded again.
    again = open_clips(url, cache=_settings(tmp_path))
    _same_clips(again, open_clips(tiny_data))
    assert cache_of(again).fetched == 0


def test_http_tfrecord_reads_as_local(tiny_tfrecord, tmp_path):
    with serve_folder(tiny_tfrecord) as url:
        store = open_clips(url, cache=_settings(tmp_path))
        _same_clips(store, open_clips(tiny_tfrecord))


@pytest.mark.parametrize("backend", with_test_backends("tfrecord"))
def test_a_conversion_indexed_from_small_files_opens_without_downloading_its_bulk(s3_server, tiny_data, tmp_path,
                                                                                   backend):
    """A TFRecord shard is indexed from its shard.json and part commits (a backend's ``ShardFiles.index``):
    opening downloads no record file; the first read of a clip downloads its one shard."""
    local = tiny_as(backend, tiny_data)
    url = s3_server.upload(local, s3_server.bucket())
    store = open_clips(url, cache=_settings(tmp_path))
    assert cache_of(store).downloads() == [] and len(store) == len(open_clips(local))
    store.get(0)
    assert cache_of(store).downloads() == [store.manifest.shards[0].name]


def test_an_lmdb_conversion_opens_from_its_index_files_alone(s3_server, tiny_data, tmp_path):
    """An LMDB shard is indexed from its index.json: opening downloads no data.mdb (the index equals what the data
    says: the same clips in the same storage order); the first read of a clip downloads its one shard."""
    url = s3_server.upload(tiny_data, s3_server.bucket())
    store = open_clips(url, cache=_settings(tmp_path))
    local = open_clips(tiny_data)
    assert cache_of(store).downloads() == [] and cache_of(store).fetched_bytes == 0
    assert len(store) == len(local) and np.array_equal(store.storage_order(), local.storage_order())
    store.get(0)
    assert cache_of(store).downloads() == [store.manifest.shards[0].name]
    _same_clips(store, local)


@pytest.mark.parametrize("version", [2, 3])
def test_an_lmdb_conversion_without_index_files_opens_by_downloading_its_shards(s3_server, tiny_data, tmp_path,
                                                                                version):
    """Shards finished before LMDB shards had an index file (a version 3 manifest listing data.mdb alone, or a
    version 2 manifest listing no files): opening indexes each shard from its data, downloaded whole."""
    old = copy_conversion(tiny_data, str(tmp_path / "old"))
    path = os.path.join(old, "manifest.json")
    manifest = json.load(open(path))
    for shard in manifest["shards"]:
        os.remove(os.path.join(old, shard["path"], "index.json"))
    for files in manifest["shard_files"].values():
        files[:] = [f for f in files if f["name"] != "index.json"]
    if version == 2:
        manifest["format_version"] = 2
        del manifest["shard_files"]
    json.dump(manifest, open(path, "w"))
    store = open_clips(s3_server.upload(old, s3_server.bucket()), cache=_settings(tmp_path))
    assert sorted(cache_of(store).downloads()) == sorted(s.name for s in store.manifest.shards)
    _same_clips(store, open_clips(tiny_data))


@pytest.mark.parametrize("backend", with_test_backends("tfrecord"))
def test_file_url(tiny_data, tmp_path, backend):
    local = tiny_as(backend, tiny_data)
    store = open_clips(f"file://{local}", cache=_settings(tmp_path))
    _same_clips(store, open_clips(local))


def _bucket_copy(s3_server, local: str) -> tuple[str, str]:
    bucket = s3_server.bucket()
    return bucket, s3_server.upload(local, bucket)


@pytest.mark.parametrize("backend", with_test_backends("tfrecord"))
def test_flipped_byte_is_caught_on_arrival(s3_server, tiny_data, tmp_path, backend):
    bucket, url = _bucket_copy(s3_server, tiny_as(backend, tiny_data))
    manifest = json.loads(s3_server.fs().cat_file(f"{bucket}/data/manifest.json"))
    shard = manifest["shards"][0]
    bulk = max(manifest["shard_files"][shard["name"]], key=lambda f: f["bytes"])["name"]  # where the clips lie
    key = f"{bucket}/data/{shard['path']}/{bulk}"
    fs = s3_server.fs()
    data = bytearray(fs.cat_file(key))
    data[len(data) // 2] ^= 0x01
    fs.pipe_file(key, bytes(data))
    with pytest.raises(FormatError) as err:  # at open (the index is built from the shards) or at the read
        store = open_clips(url, cache=_settings(tmp_path))
        for i in range(len(store)):
            store.get(i)
    assert f"{url}/{shard['path']}" in str(err.value) and "\n" not in str(err.value)
    assert "on arrival" in str(err.value)
    # Nothing corrupt stayed in the cache for another reader to take for whole.
    cache = ShardCache(url, _settings(tmp_path, limit=1 << 30))
    assert not cache.present(0)


def test_flipped_byte_lmdb(s3_server, tiny_data, tmp_path):
    bucket, url = _bucket_copy(s3_server, tiny_data)
    manifest = json.loads(s3_server.fs().cat_file(f"{bucket}/data/manifest.json"))
    key = f"{bucket}/data/{manifest['shards'][1]['path']}/data.mdb"
    fs = s3_server.fs()
    data = bytearray(fs.cat_file(key))
    # A byte inside the first clip's payload: after its 36-byte header and video id.
    start = bytes(data).index(b"VCLP")
    id_len = int.from_bytes(data[start + 14:start + 16], "little")
    offset = start + 36 + id_len + 20
    data[offset] ^= 0x40
    fs.pipe_file(key, bytes(data))
    with pytest.raises(FormatError) as err:  # on arrival: the shard is indexed from its index file at open
        store = open_clips(url, cache=_settings(tmp_path))
        for i in range(len(store)):
            store.get(i)
    assert f"{url}/{manifest['shards'][1]['path']}" in str(err.value) and "\n" not in str(err.value)


def test_verify_a_url(s3_server, tiny_tfrecord, tmp_path, capsys):
    """``python -m convert verify URL``: sound, then one flipped byte named by its shard's URL (exit 1); an
    missing bucket is one line and exit 2 (no conversion could be read)."""
    from convert.tools import main as tools_main

    bucket, url = _bucket_copy(s3_server, tiny_tfrecord)
    cache = ["--cache-dir", str(tmp_path / "cache")]
    assert tools_main(["verify", url, *cache]) == 0
    assert capsys.readouterr().out.strip() == f"{url}: ok (4 shards, 20 videos, 40 clips)"
    fs = s3_server.fs()
    manifest = json.loads(fs.cat_file(f"{bucket}/data/manifest.json"))
    shard = manifest["shards"][2]
    key = f"{bucket}/data/{shard['path']}/{shard['files'][0]['path']}"
    data = bytearray(fs.cat_file(key))
    data[len(data) // 2] ^= 0x01
    fs.pipe_file(key, bytes(data))
    assert tools_main(["verify", url, "--cache-dir", str(tmp_path / "other")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"verify: {url}/{shard['path']}") and "on arrival" in err[0], err
    gone = "s3://nobucket/data"
    code = tools_main(["verify", gone, *cache, "--cache-limit", "1G"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith(f"verify: error: {gone}/manifest.json"), err


def test_truncated_object(s3_server, tiny_tfrecord, tmp_path):
    bucket, url = _bucket_copy(s3_server, tiny_tfrecord)
    fs = s3_server.fs()
    manifest = json.loads(fs.cat_file(f"{bucket}/data/manifest.json"))
    shard = manifest["shards"][-1]
    key = f"{bucket}/data/{shard['path']}/{shard['files'][0]['path']}"
    fs.pipe_file(key, fs.cat_file(key)[:-100])
    with pytest.raises(FormatError, match="truncated") as err:
        store = open_clips(url, cache=_settings(tmp_path))
        for i in range(len(store)):
            store.get(i)
    assert f"{url}/{shard['path']}/{shard['files'][0]['path']}" in str(err.value)


def test_deleted_shard_and_missing_manifest(s3_server, tiny_data, tmp_path):
    bucket, url = _bucket_copy(s3_server, tiny_data)
    fs = s3_server.fs()
    manifest = json.loads(fs.cat_file(f"{bucket}/data/manifest.json"))
    fs.rm(f"{bucket}/data/{manifest['shards'][0]['path']}", recursive=True)
    with pytest.raises(ShardMissing) as err:
        open_clips(url, cache=_settings(tmp_path))
    assert f"{url}/{manifest['shards'][0]['path']}" in str(err.value) and "no object" in str(err.value)
    with pytest.raises(ShardMissing, match="manifest.json: no such object"):
        open_clips(f"s3://{bucket}/elsewhere", cache=_settings(tmp_path))


def test_unreachable_endpoint(s3_server, tmp_path):
    # The endpoint as an fsspec storage option; nothing listens on port 9 (discard).
    settings = _settings(tmp_path, storage_options={"endpoint_url": "http://127.0.0.1:9"})
    with pytest.raises(RemoteError) as err:
        open_clips("s3://nobucket/data", cache=settings)
    text = str(err.value)
    assert text.startswith("s3://nobucket/data/manifest.json:") and "unreachable" in text and "2 attempts" in text
    assert err.value.transient


def test_missing_credentials(s3_server, tmp_path):
    """No credentials anywhere the AWS client looks (a child process, so no client is reused): one line, not
    retried."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_EC2_METADATA_DISABLED="true", AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
               AWS_CONFIG_FILE=str(tmp_path / "none"), AWS_ENDPOINT_URL=s3_server.endpoint,
               PYTHONPATH=ROOT + os.pathsep + env.get("PYTHONPATH", ""))
    code = ("from convert.store import open_clips\n"
            "from convert.store.cache import CacheSettings\n"
            f"open_clips('s3://any/data', cache=CacheSettings(cache_dir={str(tmp_path / 'c')!r}))\n")
    got = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    last = got.stderr.strip().splitlines()[-1]
    assert got.returncode == 1 and "RemoteError: s3://any/data/manifest.json: reading failed: no credentials" in last
    assert "attempts" not in last


def test_endpoint_and_credentials_from_fsspec_configuration(s3_server, tiny_tfrecord, tmp_path):
    """No AWS variable at all: the endpoint and keys come from fsspec's own configuration (``FSSPEC_S3``, a
    JSON object of storage options), which every reader takes as it is (here ``python -m convert verify``)."""
    url = s3_server.upload(tiny_tfrecord, s3_server.bucket())
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    options = {"endpoint_url": s3_server.endpoint, "key": "testing", "secret": "testing"}
    env.update(AWS_EC2_METADATA_DISABLED="true", AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
               AWS_CONFIG_FILE=str(tmp_path / "none"), AWS_DEFAULT_REGION="us-east-1",
               FSSPEC_S3=json.dumps(options), PYTHONPATH=ROOT + os.pathsep + env.get("PYTHONPATH", ""))
    got = subprocess.run([sys.executable, "-m", "convert", "verify", url, "--cache-dir", str(tmp_path / "c")],
                         env=env, capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip() == f"{url}: ok (4 shards, 20 videos, 40 clips)"


def test_cache_smaller_than_the_data(s3_server, tiny_tfrecord, tmp_path):
    url = s3_server.upload(tiny_tfrecord, s3_server.bucket())
    probe = open_clips(url, cache=_settings(tmp_path / "probe"))
    sizes = cache_of(probe).sizes
    assert len(sizes) >= 3
    limit = 2 * max(sizes)  # one shard read, one prefetched: less than the data
    with pytest.raises(CacheFullError, match="cache limit"):
        ShardCache(url, _settings(tmp_path, limit=max(sizes), prefetch=1))
    store = open_clips(url, cache=_settings(tmp_path, limit=limit, prefetch=1))
    cache = cache_of(store)
    before = len(cache.downloads())
    # Shard by shard (what a shard-windowed order does): each shard downloaded once per pass.
    order = np.argsort(store.shards_of(np.arange(len(store))), kind="stable")
    for i in order:
        store.get(int(i))
        assert cache.held_bytes() <= limit
    assert len(cache.downloads()) - before <= len(sizes)
    store.close()  # lets go of the shards its idle readers hold
    # A shard held by a reader is never evicted: hold shard 0, fetch the others through the limit.
    hold = cache.acquire(0)
    for s in range(1, len(sizes)):
        cache.acquire(s).release()
        assert cache.present(0)
    hold.release()


def _read_all(url: str, cache_dir: str) -> None:
    store = open_clips(url, cache=CacheSettings(cache_dir=cache_dir))
    for i in range(len(store)):
        store.get(i)


def test_processes_share_one_cache(s3_server, tiny_data, tmp_path):
    url = s3_server.upload(tiny_data, s3_server.bucket())
    cache_dir = str(tmp_path / "shared")
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_read_all, args=(url, cache_dir)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    store = open_clips(url, cache=CacheSettings(cache_dir=cache_dir))
    assert sorted(cache_of(store).downloads()) == sorted(s.name for s in store.manifest.shards)


def test_a_killed_download_leaves_no_shard(s3_server, tiny_data, tmp_path):
    """A download killed mid-way leaves a temporary folder only; the next reader downloads the shard again."""
    url = s3_server.upload(tiny_data, s3_server.bucket())
    cache_dir = str(tmp_path / "c")
    code = (f"import os, sys; sys.path.insert(0, {ROOT!r})\n"
            "from convert.store import remote\n"
            "real = remote.Remote.download\n"
            "def die(self, rel, local, size=None):\n"
            "    real(self, rel, local, size)\n"
            "    with open(local, 'r+b') as f: f.truncate(os.path.getsize(local) // 2)\n"
            "    os._exit(9)\n"
            "remote.Remote.download = die\n"
            "from convert.store import open_clips\n"
            "from convert.store.cache import CacheSettings\n"
            f"open_clips({url!r}, cache=CacheSettings(cache_dir={cache_dir!r}))\n")
    proc = subprocess.run([sys.executable, "-c", code], env=os.environ.copy(), timeout=120)
    assert proc.returncode == 9
    store = open_clips(url, cache=CacheSettings(cache_dir=cache_dir))
    _same_clips(store, open_clips(tiny_data))
    leftovers = [n for n in os.listdir(os.path.dirname(store.shard_paths[0])) if n.startswith(".tmp-")]
    assert leftovers == []


def test_a_full_cache_disk_is_one_line(s3_server, tiny_tfrecord, tmp_path):
    """A cache folder on a tmpfs smaller than two shards: the second download fails naming its URL and the disk,
    and leaves no partial shard behind."""
    disk = str(tmp_path / "disk")
    os.makedirs(disk)
    try:
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1500k", "tmpfs", disk], capture_output=True,
                                 timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        mounted = False
    if not mounted:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        url = s3_server.upload(tiny_tfrecord, s3_server.bucket())
        store = open_clips(url, cache=CacheSettings(cache_dir=disk, limit=1 << 30, attempts=2, backoff=0.01))
        with pytest.raises(CacheFullError) as err:
            for i in np.argsort(store.shards_of(np.arange(len(store))), kind="stable"):
                store.get(int(i))
        text = str(err.value)
        assert text.startswith(f"{url}/shards/") and "no space left in the cache" in text and "\n" not in text
        store.close()
        leftovers = [n for n in os.listdir(os.path.dirname(store.shard_paths[0])) if n.startswith(".tmp-")]
        assert leftovers == []
    finally:
        subprocess.run(["umount", "-l", disk], capture_output=True, timeout=30)
