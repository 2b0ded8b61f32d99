"""Real remote endpoints for the tests of remote conversions: an S3 server and an HTTP server on 127.0.0.1.

``s3_server`` is moto's standalone S3 server (``moto[server]``: it speaks the
S3 HTTP API), reached through s3fs with the standard AWS variables, as a
user's bucket would be; ``http_root`` serves a folder with the standard
library's ``http.server``. Nothing is mocked: every read crosses a socket.
Test modules import these fixtures by name.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import logging
import os
import shutil
import threading
import uuid
from collections.abc import Iterator

import pytest

# What the S3 client needs to reach the local server: the ecosystem's own variables, no code of ours.
S3_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
          # botocore's and s3fs's own retries off: the project's retry loop is what the tests watch.
          "AWS_MAX_ATTEMPTS": "1", "AWS_RETRY_MODE": "standard"}


class S3Server:
    """A moto S3 server on a fixed port of 127.0.0.1 that can be stopped and started again (same port)."""

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        self._cls = ThreadedMotoServer
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.server.start()
        self.host, self.port = self.server.get_host_and_port()
        self.endpoint = f"http://{self.host}:{self.port}"

    def stop(self) -> None:
        self.server.stop()

    def start(self) -> None:
        """Start again on the same port; the buckets are kept (moto's backend lives in this process)."""
        self.server = self._cls(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.server.start()

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
            server.stop()
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
