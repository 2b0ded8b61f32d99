"""A third storage backend kept in the tests: each shard one ``.tar`` of its clips and a small JSON index.

It lives here, not in ``convert.format``, to prove that a backend plugs in
without an edit to the package: ``tests/conftest.py`` names ``BACKEND`` in
``$VIDEOCLIPS_EXTRA_BACKENDS`` (the one registry line), and the suites that
test the backend contract take it up from ``tests/backend_params.py``. It is
no part of the on-disk format FORMAT.md specifies.

A shard is a folder of two files (``files``): ``clips.tar``, a POSIX ustar
archive with one member per clip (the clip's header and payload, the
``ClipHeader`` layout every backend stores), and ``clips.tar.index``, the
shard's metadata, its video records and each clip's (video id, clip index,
offset, size) in the archive, rewritten atomically as each video is
committed. Modules: ``files`` (names, the index and its checks),
``options``, ``writer``, ``reader``.
"""

from __future__ import annotations

from convert.format.base import Backend

from .files import FILES
from .options import TarOptions
from .reader import TarReader
from .writer import TarWriter

BACKEND = Backend(name="tar", summary="(a test backend) one ustar archive per shard and a JSON index of its "
                  "clips", writer=TarWriter, reader=TarReader, options=TarOptions, files=FILES)

__all__ = ["BACKEND", "TarOptions", "TarReader", "TarWriter"]
