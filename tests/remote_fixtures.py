"""Real remote endpoints for the tests of remote conversions: an S3 server and an HTTP server on 127.0.0.1.

``s3_server`` is moto's standalone S3 server (``moto[server]``: it speaks the
S3 HTTP API), reached through s3fs with the standard AWS variables, as a
user's bucket would be; ``http_root`` serves a folder with the standard
library's ``http.server``. Nothing is mocked: every read crosses a socket.
``s3_server`` is made available to every test module by ``conftest.py``
(one server for the session: s3fs keeps one file system per set of options
in a process, made with the endpoint of its time, so a second server,
however made, would not be the one a later file system reaches).
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import logging
import os
import shutil
import socket
import threading
import uuid
from collections.abc import Iterator
from typing import Protocol

import pytest

from convert.store.cache import ShardCache

# What the S3 client needs to reach the local server: the ecosystem's own variables, no code of ours.
S3_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
          # botocore's and s3fs's own retries off: the project's retry loop is what the tests watch.
          "AWS_MAX_ATTEMPTS": "1", "AWS_RETRY_MODE": "standard"}


class _Cached(Protocol):
    @property
    def cache(self) -> ShardCache | None: ...


def cache_of(store: _Cached) -> ShardCache:
    """The shard cache of a store (or its source) opened from a URL."""
    assert store.cache is not None, "not opened from a URL"
    return store.cache


class _Gate:
    """A TCP relay on 127.0.0.1 in front of a server. ``close()`` drops every connection through it and refuses
    new ones, as a server that went away does; ``open()`` listens again on the same port.

    Stopping moto's own server would not do: its threads keep serving the keep-alive connections a client
    already holds, so a client with a warm connection pool never sees the server go.
    """

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = 0
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self.open()

    def open(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(128)
        self.port = listener.getsockname()[1]
        with self._lock:
            self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # closed
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._listener is not listener:  # closed meanwhile
                    client.close()
                    upstream.close()
                    return
                self._conns.update((client, upstream))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(1 << 16)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            self._drop(src, dst)

    def _drop(self, *socks: socket.socket) -> None:
        for s in socks:
            with self._lock:
                self._conns.discard(s)
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def close(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
            conns, self._conns = list(self._conns), set()
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in accept()
            listener.close()
        self._drop(*conns)


class S3Server:
    """A moto S3 server on 127.0.0.1 behind a gate that can be closed (the server is gone: open connections
    drop, new ones are refused) and opened again on the same port, the buckets kept."""

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.server.start()
        self.gate = _Gate(self.server.get_host_and_port())
        self.host, self.port = "127.0.0.1", self.gate.port
        self.endpoint = f"http://{self.host}:{self.port}"

    def stop(self) -> None:
        """The server is gone for its clients."""
        self.gate.close()

    def start(self) -> None:
        """The server is back, on the same port, with the same buckets."""
        self.gate.open()

    def shutdown(self) -> None:
        self.gate.close()
        self.server.stop()

    def fs(self):
        import s3fs

        return s3fs.S3FileSystem(skip_instance_cache=True)

    def bucket(self) -> str:
        """A new empty bucket's name."""
        name = f"b-{uuid.uuid4().hex[:12]}"
        self.fs().mkdir(name)
        return name

    def upload(self, local: str, bucket: str, prefix: str = "data") -> str:
        """Copy the folder ``local`` to ``s3://bucket/prefix`` (lock files and logs left out); its URL."""
        fs = self.fs()
        for dirpath, _, files in os.walk(local):
            for name in files:
                if name in ("lock.mdb", ".lock") or "/logs" in dirpath or "/.progress" in dirpath:
                    continue
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, local)
                fs.put_file(path, f"{bucket}/{prefix}/{rel}")
        return f"s3://{bucket}/{prefix}"


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # the server's request log
    saved = {k: os.environ.get(k) for k in (*S3_ENV, "AWS_ENDPOINT_URL")}
    server = S3Server()
    os.environ.update(S3_ENV)
    os.environ["AWS_ENDPOINT_URL"] = server.endpoint
    try:
        yield server
    finally:
        with contextlib.suppress(Exception):
            server.shutdown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args) -> None:  # noqa: A002 - the standard library's signature
        pass


@contextlib.contextmanager
def serve_folder(folder: str) -> Iterator[str]:
    """``folder`` served over HTTP on 127.0.0.1; the base URL."""
    handler = functools.partial(_Quiet, directory=folder)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def copy_conversion(src: str, dst: str) -> str:
    """A copy of a conversion folder without its lock files (what is uploaded)."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("lock.mdb", ".lock", "logs", ".progress"))
    return dst
