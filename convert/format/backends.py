"""The backend registry: the manifest's ``backend`` name -> its writer, reader and options.

Adding a backend: a subpackage holding its writer, reader and options
(``convert.format.base`` says what they must offer), one line here, and one
section of FORMAT.md.
"""

from __future__ import annotations

from .base import Backend
from .errors import FormatError
from .lmdb import LmdbOptions, LmdbReader, LmdbWriter
from .lmdb.common import FILES as LMDB_FILES
from .tfrecord import TFRecordOptions, TFRecordReader, TFRecordWriter
from .tfrecord.reader import FILES as TFRECORD_FILES

BACKENDS: dict[str, Backend] = {
    "lmdb": Backend(name="lmdb", summary="one LMDB environment per shard, one key per clip", writer=LmdbWriter,
                    reader=LmdbReader, options=LmdbOptions, files=LMDB_FILES),
    "tfrecord": Backend(name="tfrecord", summary="tf.train.Example records with DALI index files, read natively "
                        "by DALI", writer=TFRecordWriter, reader=TFRecordReader, options=TFRecordOptions,
                        files=TFRECORD_FILES, manifest_extras=("files",)),
}


def get_backend(name: str) -> Backend:
    """The backend called ``name``; the error lists those that exist."""
    backend = BACKENDS.get(name)
    if backend is None:
        raise FormatError(f"unknown backend {name!r}; this reader knows {', '.join(BACKENDS)}")
    return backend


__all__ = ["BACKENDS", "get_backend"]
