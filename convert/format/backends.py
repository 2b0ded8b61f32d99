"""The backend registry: the manifest's ``backend`` name -> its writer, reader and options.

Adding a backend to the package: a subpackage holding its writer, reader and
options (``convert.format.base`` says what they must offer), one line in
``BUILT_IN``, and one section of FORMAT.md.

Plugging one in without editing the package: ``$VIDEOCLIPS_EXTRA_BACKENDS``
lists ``name=module:attribute`` entries (comma-separated), each naming a
``Backend`` defined elsewhere. The variable is read on every lookup, and the
module imported only when its backend is first looked up, never at import:
so a conversion's shard processes, which start from a fresh fork server or
interpreter, find the same backends as the job that started them (they
inherit its environment), where a registration made in the job's memory
would be lost.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Mapping

from .base import Backend
from .errors import FormatError
from .lmdb import LmdbOptions, LmdbReader, LmdbWriter
from .lmdb.common import FILES as LMDB_FILES
from .system import import_named
from .tfrecord import TFRecordOptions, TFRecordReader, TFRecordWriter
from .tfrecord.reader import FILES as TFRECORD_FILES

EXTRA_BACKENDS_ENV = "VIDEOCLIPS_EXTRA_BACKENDS"

BUILT_IN: dict[str, Backend] = {
    "lmdb": Backend(name="lmdb", summary="one LMDB environment per shard, one key per clip", writer=LmdbWriter,
                    reader=LmdbReader, options=LmdbOptions, files=LMDB_FILES),
    "tfrecord": Backend(name="tfrecord", summary="tf.train.Example records with DALI index files, read natively "
                        "by DALI", writer=TFRecordWriter, reader=TFRecordReader, options=TFRecordOptions,
                        files=TFRECORD_FILES, manifest_extras=("files",)),
}


def extra_backend_specs() -> dict[str, str]:
    """The backends ``$VIDEOCLIPS_EXTRA_BACKENDS`` plugs in, ``{name: "module:attribute"}``, in its order;
    FormatError (one line naming the variable and the entry) when an entry is malformed or takes a built-in name."""
    specs: dict[str, str] = {}
    for entry in os.environ.get(EXTRA_BACKENDS_ENV, "").split(","):
        if not entry.strip():
            continue
        name, equals, spec = (part.strip() for part in entry.partition("="))
        if not (name and equals and ":" in spec):
            raise FormatError(f"${EXTRA_BACKENDS_ENV}: entry {entry.strip()!r} is not name=module:attribute")
        if name in BUILT_IN:
            raise FormatError(f"${EXTRA_BACKENDS_ENV}: entry {entry.strip()!r} takes the name of the built-in "
                              f"backend {name!r}")
        specs[name] = spec
    return specs


class BackendRegistry(Mapping[str, Backend]):
    """The built-in backends, then those ``$VIDEOCLIPS_EXTRA_BACKENDS`` plugs in, by name.

    Names and membership read the variable only; looking a plugged-in backend
    up imports its module (once per entry and process). A read-only mapping:
    nothing is ever registered into it.
    """

    def __init__(self, built_in: Mapping[str, Backend]) -> None:
        self._built_in = dict(built_in)
        self._loaded: dict[tuple[str, str], Backend] = {}
        self._lock = threading.Lock()

    def __getitem__(self, name: str) -> Backend:
        backend = self._built_in.get(name)
        if backend is not None:
            return backend
        spec = extra_backend_specs().get(name)
        if spec is None:
            raise KeyError(name)
        with self._lock:
            loaded = self._loaded.get((name, spec))
            if loaded is None:
                loaded = self._loaded[(name, spec)] = _load(name, spec)
        return loaded

    def __contains__(self, name: object) -> bool:
        return name in self._built_in or name in extra_backend_specs()

    def __iter__(self) -> Iterator[str]:
        yield from self._built_in
        yield from extra_backend_specs()

    def __len__(self) -> int:
        return len(self._built_in) + len(extra_backend_specs())

    def plugged_in(self) -> list[str]:
        """The names of the backends the environment plugs in (none of them specified by FORMAT.md)."""
        return list(extra_backend_specs())


def _load(name: str, spec: str) -> Backend:
    """The ``Backend`` that ``spec`` names, checked to be one and to be called ``name``."""
    where = f"${EXTRA_BACKENDS_ENV}: {name}={spec}"
    try:
        backend = import_named(spec)
    except ImportError as exc:
        raise FormatError(f"{where}: cannot import it: {exc}") from exc
    except AttributeError as exc:
        raise FormatError(f"{where}: no such attribute: {exc}") from exc
    if not isinstance(backend, Backend):
        raise FormatError(f"{where}: names a {type(backend).__name__}, not a convert.format.base.Backend")
    if backend.name != name:
        raise FormatError(f"{where}: names the backend called {backend.name!r}")
    return backend


BACKENDS = BackendRegistry(BUILT_IN)


def get_backend(name: str) -> Backend:
    """The backend called ``name``; the error lists those that exist."""
    backend = BACKENDS.get(name)
    if backend is None:
        raise FormatError(f"unknown backend {name!r}; this reader knows {', '.join(BACKENDS)}")
    return backend


__all__ = ["BACKENDS", "BUILT_IN", "EXTRA_BACKENDS_ENV", "BackendRegistry", "extra_backend_specs", "get_backend"]
