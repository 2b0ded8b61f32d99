"""Conversions at a URL: object storage, HTTP, any file system fsspec reads.

``Remote(url)`` is a conversion folder at ``s3://``, ``gs://``, ``http(s)://``,
``file://`` (anything fsspec has a file system for): listing, whole-file
downloads and uploads, each retried with backoff on a transient error, and
every failure one line naming the URL and the reason (``RemoteError``).
Credentials and endpoints come the ecosystem's way: the standard AWS
variables and files (``AWS_ACCESS_KEY_ID``, ``AWS_ENDPOINT_URL``,
``~/.aws/config``...), fsspec's own configuration (``FSSPEC_S3_...``
variables, its config files) or ``storage_options`` passed in; never the
manifest.

fsspec (and s3fs, gcsfs...) is imported only when a URL is used, so a reader
of local folders never imports it.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import asyncio  # imported where a file system is made (fsspec's import does anyway): 30 ms for local readers

from convert.format.backends import BACKENDS
from convert.format.base import hexdigest_of
from convert.format.errors import FormatError, ShardMissing
from convert.format.layout import MANIFEST, MAX_JSON_BYTES, parse_json
from convert.format.manifest import Manifest

log = logging.getLogger(__name__)

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
T = TypeVar("T")

# Defaults of the retry loop: a transient error is tried again after 0.5, 1, 2, 4 s... up to ATTEMPTS tries.
ATTEMPTS = 5
BACKOFF_S = 0.5
BACKOFF_MAX_S = 8.0
# What installs the file systems this module reaches, named in the error when one is missing.
_PACKAGES = {"s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs", "abfs": "adlfs",
             "http": "aiohttp", "https": "aiohttp"}
READ_ONLY = ("http", "https")


def is_url(path: object) -> bool:
    """True when ``path`` is a URL (``scheme://...``) rather than a local path."""
    return isinstance(path, str) and _SCHEME.match(path) is not None


def check_url(url: str) -> str:
    """``url`` without trailing slashes, when it names a place: a bucket or host after ``scheme://`` (a path after
    ``file://``); ValueError in one line otherwise (``s3://`` alone would be a local folder named ``s3:``)."""
    m = _SCHEME.match(url)
    if m is None:
        raise ValueError(f"{url!r} is not a URL (scheme://...)")
    rest = url[m.end():]
    if m.group(1).lower() == "file":
        if not rest.strip("/"):
            raise ValueError(f"{url}: no path after file://; give file:///PATH")
    elif not rest.split("/", 1)[0]:
        raise ValueError(f"{url}: no bucket or host after {m.group(0)}; give {m.group(0)}BUCKET/PREFIX")
    return url.rstrip("/")


def scheme(url: str) -> str:
    m = _SCHEME.match(url)
    return m.group(1).lower() if m else ""


class RemoteError(OSError):
    """A URL that could not be read or written: one line naming it and the reason.

    ``transient`` says whether trying again later may succeed (an endpoint
    that did not answer, a server error) or not (no credentials, access
    denied): a problem of the machine or the network, never of the data.
    """

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient

    def __str__(self) -> str:
        return str(self.args[0])


def classify(exc: BaseException) -> tuple[bool, str]:
    """(transient, reason in words) of an exception raised by an fsspec file system."""
    name = type(exc).__name__
    text = " ".join(str(exc).split()) or name
    if len(text) > 200:
        text = text[:197] + "..."
    if name in ("NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError"):
        return False, ("no credentials (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, a profile in "
                       "~/.aws/credentials, or storage options)")
    if isinstance(exc, PermissionError) or name in ("ClientAuthenticationError",):
        return False, f"access denied ({text}; check the credentials)"
    lowered = text.lower()
    if any(k in lowered for k in ("nosuchbucket", "no such bucket", "bucket does not exist")):
        return False, "no such bucket (check the URL's bucket name and the endpoint)"
    if isinstance(exc, FileNotFoundError):
        return False, "no such object"
    if isinstance(exc, (IsADirectoryError, NotADirectoryError)):
        return False, text
    status = getattr(exc, "status", None) or getattr(exc, "code", None)
    if isinstance(status, int) and 400 <= status < 500 and status not in (408, 429):
        return False, f"HTTP {status} ({text})"
    if any(k in lowered for k in ("invalidaccesskeyid", "signaturedoesnotmatch", "accessdenied", "forbidden")):
        return False, f"access denied ({text}; check the credentials)"
    if any(k in name for k in ("Connect", "Timeout", "Endpoint")) or isinstance(exc, (ConnectionError, TimeoutError)):
        return True, f"endpoint unreachable ({text})"
    if isinstance(exc, OSError) or any(k in name for k in ("ClientError", "ServerDisconnected", "Payload")):
        return True, text
    return True, f"{name}: {text}"


def retried(what: str, url: str, fn: Callable[[], T], *, attempts: int = ATTEMPTS, backoff: float = BACKOFF_S,
            on_retry: Callable[[int, str], None] | None = None) -> T:
    """``fn()``, tried up to ``attempts`` times while its error is transient; RemoteError naming ``url`` otherwise.

    The waits double from ``backoff`` seconds (at most BACKOFF_MAX_S). A
    ``FormatError`` (the data itself is wrong) is never retried.
    """
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except (FormatError, RemoteError):
            raise
        except Exception as exc:  # noqa: BLE001 - every file system raises its own types; classify sorts them
            if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise  # the local disk is full: not the URL's problem, and no retry frees it (the caller says so)
            transient, reason = classify(exc)
            if not transient or attempt == attempts:
                tries = f" (after {attempt} attempts)" if attempt > 1 else ""
                raise RemoteError(f"{url}: {what} failed: {reason}{tries}", transient=transient) from exc
            if on_retry is not None:
                on_retry(attempt, reason)
            time.sleep(min(BACKOFF_MAX_S, backoff * 2 ** (attempt - 1)))
    raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises


# What asyncio says of a task or future that failed with nobody awaiting it, when it is collected.
_UNRETRIEVED = ("Task exception was never retrieved", "Future exception was never retrieved")


def _lost_connection(exc: object) -> bool:
    """Whether ``exc`` says a request's connection failed: an OSError (a reset, a refusal, a timeout, a network
    that cannot be reached: on fsspec's loop, the network's) or one of aiohttp's own errors (some, such as
    ``ServerDisconnectedError``, are no OSError), told by their classes' module, so that this never imports
    aiohttp."""
    if isinstance(exc, OSError):
        return True
    return isinstance(exc, Exception) and any(cls.__module__.split(".")[0] == "aiohttp" for cls in type(exc).__mro__)


def _quiet_lost_connections(loop: asyncio.AbstractEventLoop) -> None:
    """Give ``loop`` (fsspec's, where s3fs, gcsfs... run aiohttp) an exception handler that drops the tasks
    failed by a lost connection that nobody awaited, and passes everything else on; once per loop.

    An endpoint that resets connections during an upload left 92 to 116 of
    aiohttp's tasks failed and unawaited (a request's body writer, whose
    request had already failed): asyncio printed each as a "Task exception
    was never retrieved" traceback on stderr when it was collected, before
    the one line that the retry loop's ``RemoteError`` makes of the same
    failure. They are logged at debug level instead.
    """
    with _quieted_lock:
        if loop in _quieted:
            return
        _quieted.add(loop)
        previous = loop.get_exception_handler()

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if context.get("message") in _UNRETRIEVED and _lost_connection(exc):
            log.debug("a request's task failed unawaited on fsspec's event loop: %s: %s", type(exc).__name__, exc)
            return
        if previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handler)


_quieted: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()  # loops given the handler above
_quieted_lock = threading.Lock()


class Remote:
    """A conversion folder at ``url``, through fsspec (imported on first use); picklable (no open handles).

    ``attempts``/``backoff``: the retry loop of every operation (``retried``).
    """

    def __init__(self, url: str, *, storage_options: dict[str, Any] | None = None, attempts: int = ATTEMPTS,
                 backoff: float = BACKOFF_S) -> None:
        self.url = check_url(url)
        self.scheme = scheme(url)
        self.storage_options = dict(storage_options or {})
        self.attempts = attempts
        self.backoff = backoff
        self._fs: Any = None
        self._fs_pid = 0
        self._base = ""

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_fs"] = None  # a file system holds sessions and event loops: made again where it lands
        return state

    @property
    def fs(self) -> Any:
        """The fsspec file system (made on first use, and again in a forked child: s3fs's is not fork-safe)."""
        if self._fs is None or self._fs_pid != os.getpid():
            try:
                import fsspec
                import fsspec.core
            except ImportError as exc:
                raise RemoteError(f"{self.url}: reading URLs needs fsspec: pip install 'videoclips[remote]'") from exc
            try:
                fs, base = fsspec.core.url_to_fs(self.url, **self.storage_options)
            except ImportError as exc:
                package = _PACKAGES.get(self.scheme, f"the fsspec file system for {self.scheme}://")
                raise RemoteError(f"{self.url}: {self.scheme}:// needs {package}: pip install {package}") from exc
            except ValueError as exc:
                raise RemoteError(f"{self.url}: {exc}") from exc
            import asyncio

            loop = getattr(fs, "loop", None)  # an async file system's (s3fs, gcsfs, HTTP): fsspec's IO thread's
            if isinstance(loop, asyncio.AbstractEventLoop):
                _quiet_lost_connections(loop)
            self._fs, self._fs_pid, self._base = fs, os.getpid(), base.rstrip("/")
        return self._fs

    def join(self, rel: str) -> str:
        """The URL of ``rel`` (a path relative to the folder)."""
        return f"{self.url}/{rel}" if rel else self.url

    def _path(self, rel: str) -> str:
        fs = self.fs
        del fs  # made first: it sets the base path
        return f"{self._base}/{rel}" if rel else self._base

    def _retried(self, what: str, rel: str, fn: Callable[[], T]) -> T:
        return retried(what, self.join(rel), fn, attempts=self.attempts, backoff=self.backoff)

    def exists(self, rel: str) -> bool:
        """Whether object ``rel`` is there (no cached listing)."""
        def check() -> bool:
            self.fs.invalidate_cache()
            return bool(self.fs.exists(self._path(rel)))

        return self._retried("checking", rel, check)

    def read_bytes(self, rel: str, *, limit: int | None = None) -> bytes:
        """The whole object ``rel`` (its first ``limit + 1`` bytes at most, when ``limit`` is given: the caller
        refuses a longer one unread); ShardMissing naming its URL when it is not there."""
        end = None if limit is None else limit + 1
        try:
            data: bytes = self._retried("reading", rel, lambda: self.fs.cat_file(self._path(rel), start=0, end=end))
            return data
        except RemoteError as exc:
            if isinstance(exc.__cause__, FileNotFoundError) and "no such bucket" not in str(exc):
                raise ShardMissing(f"{self.join(rel)}: no such object") from exc
            raise

    def listing(self, rel: str) -> dict[str, dict[str, Any]]:
        """Every object under folder ``rel``: {path relative to ``rel``: the file system's details}; an
        absent folder lists nothing."""
        def listing() -> dict[str, dict[str, Any]]:
            self.fs.invalidate_cache()
            base = self._path(rel).rstrip("/")
            try:
                found = self.fs.find(base, detail=True)
            except FileNotFoundError:
                return {}
            return {path.rstrip("/")[len(base) + 1:]: info for path, info in found.items()
                    if info.get("type") != "directory" and path.rstrip("/").startswith(base + "/")}

        return self._retried("listing", rel, listing)

    def files(self, rel: str) -> dict[str, int]:
        """Every object under folder ``rel``: {path relative to ``rel``: size in bytes}."""
        def listing() -> dict[str, int]:
            self.fs.invalidate_cache()
            base = self._path(rel).rstrip("/")
            found = self.fs.find(base, detail=True)
            out = {}
            for path, info in found.items():
                path = path.rstrip("/")
                if info.get("type") == "directory" or not path.startswith(base + "/"):
                    continue
                size = info.get("size")
                if size is None:  # an HTTP directory listing has no sizes: the object's own headers do
                    size = self.fs.info(path).get("size")
                if size is None:
                    raise OSError(f"{path}: the server gives no size")
                out[path[len(base) + 1:]] = int(size)
            return out

        return self._retried("listing", rel, listing)

    def download(self, rel: str, local: str, size: int | None = None) -> None:
        """Object ``rel`` into file ``local`` (whole, retried); FormatError when it is not ``size`` bytes."""
        def get() -> None:
            self.fs.get_file(self._path(rel), local)

        try:
            self._retried("downloading", rel, get)
        except RemoteError as exc:
            if isinstance(exc.__cause__, FileNotFoundError):
                raise ShardMissing(f"{self.join(rel)}: no such object (deleted since the listing?)") from exc
            raise
        got = os.path.getsize(local)
        if size is not None and got != size:
            raise FormatError(f"{self.join(rel)}: {got} bytes arrived, {size} expected (truncated object?)")

    def upload(self, local: str, rel: str) -> None:
        """File ``local`` to object ``rel`` (whole, retried). An object store's put is atomic; on a file
        system (``file://`` and the like) the object is written under a temporary name and renamed."""
        if self.scheme in READ_ONLY:
            raise RemoteError(f"{self.join(rel)}: {self.scheme}:// is read-only here (write to s3://, gs://, "
                              f"file://...)")
        path = self._path(rel)

        def put() -> None:
            if getattr(self.fs, "protocol", None) in ("file", ("file", "local")) or self.scheme == "file":
                tmp = f"{path}.tmp-{os.getpid()}"
                self.fs.makedirs(os.path.dirname(path), exist_ok=True)
                self.fs.put_file(local, tmp)
                self.fs.mv(tmp, path)
            else:
                self.fs.put_file(local, path)

        self._retried("uploading", rel, put)

    def md5(self, rel: str) -> str:
        """The MD5 of object ``rel``'s bytes, read through (for file systems with no checksum of their own)."""
        def digest() -> str:
            import hashlib

            with self.fs.open(self._path(rel), "rb") as f:
                return hexdigest_of(f, hashlib.md5(usedforsecurity=False))

        return self._retried("reading", rel, digest)

    def check_writable(self) -> None:
        """Write and remove a small object under the folder: RemoteError at once (no such bucket, no write access,
        an endpoint that does not answer) rather than after a whole conversion."""
        import tempfile

        rel = f".write-check-{os.getpid()}"
        with tempfile.NamedTemporaryFile() as f:
            f.write(b"videoclips write check\n")
            f.flush()
            self.upload(f.name, rel)
        self.remove(rel)

    def remove(self, rel: str) -> None:
        """Delete object ``rel`` when it is there."""
        def rm() -> None:
            if self.fs.exists(self._path(rel)):
                self.fs.rm_file(self._path(rel))

        self._retried("removing", rel, rm)


def read_remote_json(remote: Remote, rel: str, what: str) -> tuple[bytes, Any]:
    """(bytes, parsed JSON) of metadata object ``rel``, with the guards of a local metadata file (``parse_json``: at
    most MAX_JSON_BYTES read, no traceback for any content); FormatError naming its URL."""
    raw = remote.read_bytes(rel, limit=MAX_JSON_BYTES)
    return raw, parse_json(raw, remote.join(rel), what, limit=MAX_JSON_BYTES)


def read_remote_manifest(remote: Remote) -> tuple[bytes, Manifest]:
    """(bytes, checked manifest) of the conversion at ``remote``: the one reader of a remote ``manifest.json``,
    with a local manifest's guards (``read_remote_json``, then ``Manifest.from_dict``); FormatError naming its URL.

    Each shard's listed files are checked against its backend's
    (``ShardFiles.check_listed``) as it is read, before anything is fetched:
    the list says what a cache copies into a shard's folder, and whoever can
    write the bucket writes it. A backend this process does not have is said
    where the conversion is opened, as for a local one.
    """
    raw, parsed = read_remote_json(remote, MANIFEST, "manifest")
    url = remote.join(MANIFEST)
    manifest = Manifest.from_dict(parsed, url)
    if manifest.data.backend in BACKENDS:
        files = BACKENDS[manifest.data.backend].files
        for entry in manifest.shards:
            files.check_listed(entry, url)
    return raw, manifest


__all__ = ["ATTEMPTS", "READ_ONLY", "Remote", "RemoteError", "check_url", "classify", "is_url", "read_remote_json",
           "read_remote_manifest", "retried", "scheme"]
