"""docker/entrypoint.py's refusals of what a container is given: mounts that are not folders, a full OUT,
addresses that name the node itself, process counts and the trainer's ``--device``.

The entry point is run as the images run it (``main``, its one line on stderr and its status) where the
refusal is about a mount, and through the function that decides otherwise. test_docker.py covers the rest.
"""

from __future__ import annotations

import errno
import importlib.util
import os
import shutil
import subprocess
import tempfile

import pytest

from .conftest import ROOT


def _entrypoint():
    spec = importlib.util.spec_from_file_location("docker_entrypoint_refusals",
                                                  os.path.join(ROOT, "docker", "entrypoint.py"))
    assert spec is not None and spec.loader is not None  # a .py file's path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


entrypoint = _entrypoint()


def _run(monkeypatch, capsys, argv: list[str], data: str | None = None, out: str | None = None) -> tuple[int, str]:
    """``main(argv)`` with DATA and OUT mounted elsewhere: its status and its stderr (nothing is exec'd: a
    refusal returns before)."""
    if data is not None:
        monkeypatch.setattr(entrypoint, "DATA", data)
    if out is not None:
        monkeypatch.setattr(entrypoint, "OUT", out)
    monkeypatch.setattr(entrypoint.os, "execvp", lambda *a: pytest.fail(f"exec'd {a}"))
    status = entrypoint.main(argv)
    return status, capsys.readouterr().err


def _not_a_folder(tmp_path, kind: str) -> str:
    path = str(tmp_path / kind)
    if kind == "file":
        with open(path, "w") as fh:
            fh.write("not a dataset\n")
    elif kind == "FIFO":
        os.mkfifo(path)
    elif kind == "symlink loop":
        os.symlink(path, path)
    elif kind == "symlink to a missing path":
        os.symlink(str(tmp_path / "gone"), path)
    return path


@pytest.mark.parametrize("kind", ["file", "FIFO", "symlink loop", "symlink to a missing path"])
def test_data_that_is_not_a_folder_is_one_line(tmp_path, monkeypatch, capsys, kind):
    data = _not_a_folder(tmp_path, kind)
    with pytest.raises(entrypoint.Refusal, match=f"is a {kind}, expected a folder$"):
        entrypoint.check_data(data)
    status, err = _run(monkeypatch, capsys, ["convert", "--src", "/data/annotations/train.csv"], data=data,
                       out=str(tmp_path))
    assert status == 2 and err == f"videoclips convert: error: DATA (mounted at {data}) is a {kind}, " \
                                  "expected a folder\n", err


@pytest.mark.parametrize("kind", ["file", "FIFO", "symlink loop"])
def test_out_that_is_not_a_folder_is_one_line(tmp_path, monkeypatch, capsys, kind):
    out = _not_a_folder(tmp_path, kind)
    with pytest.raises(entrypoint.Refusal, match=f"is a {kind}, expected a folder$"):
        entrypoint.check_out(out)
    status, err = _run(monkeypatch, capsys, ["check", "--smoke"], out=out)
    assert status == 2 and err == f"videoclips check: error: OUT (mounted at {out}) is a {kind}, " \
                                  "expected a folder\n", err


LOOPBACK = ["127.0.0.1", "127.0.0.2", "127.255.255.254", "127.1", "2130706433", "localhost", "LOCALHOST",
            "localhost.", "LocalHost.", " localhost ", "::1", "[::1]", "::ffff:127.0.0.1", "0.0.0.0", "0", "::"]
ELSEWHERE = ["10.0.0.1", "example.com", "128.0.0.1", "126.255.255.255", "node0", "localhost.example.com",
             "::ffff:10.0.0.1", "fe80::1", "2001:db8::1", "127.0.0.1 x"]


@pytest.mark.parametrize("addr", LOOPBACK + ELSEWHERE)
def test_a_loopback_master_is_refused_on_other_nodes_in_every_spelling(addr):
    """A node other than 0 given a MASTER_ADDR that reaches itself would wait for a master of its own."""
    env = {"NNODES": "2", "NODE_RANK": "1", "MASTER_ADDR": addr}
    if addr in LOOPBACK:
        with pytest.raises(entrypoint.Refusal, match="names this node: set it to node 0's address"):
            entrypoint.rendezvous(env)
    else:
        assert f"--master_addr={addr.strip()}" in entrypoint.rendezvous(env)
    assert entrypoint.is_loopback(addr) is (addr in LOOPBACK)
    # Node 0 runs the master itself: any address of its own is right there.
    assert entrypoint.rendezvous({**env, "NODE_RANK": "0"})[0] == "--nnodes=2"


def test_cpu_process_count_is_bounded_by_the_cpus():
    with pytest.raises(entrypoint.Refusal, match=r"^NPROC_PER_NODE=100000 with --device cpu but the container "
                                                 r"may use \d+ CPU\(s\): one process per CPU at most$"):
        entrypoint.processes({"NPROC_PER_NODE": "100000"}, ["--device", "cpu"], gpus=lambda: 0)
    with pytest.raises(entrypoint.Refusal, match=r"NPROC_PER_NODE=5 with --device cpu but the container may use 4"):
        entrypoint.processes({"NPROC_PER_NODE": "5"}, ["--device", "cpu"], gpus=lambda: 0, cpus=lambda: 4)
    assert entrypoint.processes({"NPROC_PER_NODE": "4"}, ["--device", "cpu"], gpus=lambda: 0, cpus=lambda: 4) == "4"
    assert 1 <= entrypoint.usable_cpus() <= (os.cpu_count() or 1)


CPU_ARGS = [["--device=cpu:0"], ["--devi", "cpu"], ["--dev=cpu"], ["--device", "cuda", "--device", "cpu"],
            ["--lr", "0.1", "--device", "cpu", "--max-steps", "4"]]
GPU_ARGS = [[], ["--device", "auto"], ["--device", "cpu", "--device", "cuda"], ["--device=cuda:0"]]


@pytest.mark.parametrize("args", CPU_ARGS + GPU_ARGS)
def test_device_is_read_as_the_trainer_reads_it(args):
    """The entry point's ``--device`` is the trainer's own parse of the same arguments, and decides the GPU check."""
    from train.args import build_parser as train_parser

    trainer = train_parser().parse_args(["--data", "/out/clips_train", *args]).device
    assert (args in CPU_ARGS) is trainer.startswith("cpu")
    if args in CPU_ARGS:
        assert entrypoint.processes({"NPROC_PER_NODE": "1"}, args, gpus=lambda: 0) == "1"
    else:
        with pytest.raises(entrypoint.Refusal, match="no GPU visible in the container"):
            entrypoint.processes({"NPROC_PER_NODE": "1"}, args, gpus=lambda: 0)
    assert entrypoint.device(args) == trainer


def test_a_device_option_without_its_value_is_one_line():
    with pytest.raises(entrypoint.Refusal, match="^the trainer's arguments: argument --device: expected one argument$"):
        entrypoint.processes({}, ["--device"], gpus=lambda: 0)


@pytest.fixture
def small_fs(tmp_path):
    """A tmpfs of 1 MiB and 16 inodes at tmp_path/fs, or None where this user may not mount one."""
    path = tmp_path / "fs"
    path.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        yield None
        return
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1M,nr_inodes=16", "tmpfs", str(path)],
                           capture_output=True, text=True)
    if mount.returncode != 0:  # a container without CAP_SYS_ADMIN: the tests simulate the error instead
        yield None
        return
    try:
        yield str(path)
    finally:
        subprocess.run(["umount", str(path)], check=True)


def _fake_mkstemp(monkeypatch, code: int) -> None:
    def fail(*args, **kwargs):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(entrypoint.tempfile, "mkstemp", fail)


def test_out_out_of_inodes_says_so_without_ownership_advice(small_fs, tmp_path, monkeypatch, capsys):
    out = small_fs
    if out is not None:
        try:
            while True:  # every inode the file system has
                os.close(tempfile.mkstemp(dir=out)[0])
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    else:
        out = str(tmp_path)
        _fake_mkstemp(monkeypatch, errno.ENOSPC)
    with pytest.raises(entrypoint.Refusal, match=r"has no room for a new file: No space left on device \(ENOSPC\)"):
        entrypoint.check_out(out)
    status, err = _run(monkeypatch, capsys, ["check", "--smoke"], out=out)
    assert status == 2 and err.count("\n") == 1, err
    assert err.startswith(f"videoclips check: error: OUT (mounted at {out}) has no room for a new file: "
                          "No space left on device (ENOSPC)"), err
    assert "chown" not in err and "VIDEOCLIPS_USER" not in err
    if small_fs is not None:
        assert ": no free inodes (16 in all); free space or files in OUT" in err


def test_out_out_of_space_is_found_by_the_probe(small_fs, tmp_path, monkeypatch):
    """A disk that is full but still has inodes takes an empty file: the probe writes a byte to find it."""
    out = small_fs
    if out is not None:
        with open(os.path.join(out, "filler"), "wb") as fh:
            try:
                while True:
                    fh.write(b"\0" * 65536)
                    fh.flush()
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
    else:
        out = str(tmp_path)

        def full(fd, data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(entrypoint.os, "write", full)
    before = sorted(os.listdir(out))
    with pytest.raises(entrypoint.Refusal, match=r"has no room for a new file: No space left on device \(ENOSPC\)"):
        entrypoint.check_out(out)
    assert sorted(os.listdir(out)) == before  # the probe is removed when its byte did not fit


@pytest.mark.parametrize("code, says, chown", [
    (errno.EDQUOT, "has no room for a new file: Disk quota exceeded (EDQUOT)", False),
    (errno.ENOSPC, "has no room for a new file: No space left on device (ENOSPC)", False),
    (errno.EACCES, "is not writable by uid", True),
    (errno.EPERM, "is not writable by uid", True),
    (errno.EROFS, "is read-only: mount it writable", False),
    (errno.EIO, "cannot take a new file: Input/output error (EIO)", False),
])
def test_out_ownership_advice_only_for_permission_errors(tmp_path, monkeypatch, code, says, chown):
    _fake_mkstemp(monkeypatch, code)
    with pytest.raises(entrypoint.Refusal) as refused:
        entrypoint.check_out(str(tmp_path))
    line = str(refused.value)
    assert says in line and ("chown" in line) is chown and "\n" not in line, line
