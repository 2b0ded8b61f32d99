"""The project's benchmarks: scripts that measure, never part of the installed packages.

Run them from the repository root (the folder holding ``benchmarks/``,
``convert/`` and ``loaders/``), so that ``benchmarks`` is importable:

  python -m benchmarks.loaders ...     clips/s of every reader (``benchmarks.loaders``)
  python -m benchmarks.conversion ...  conversion speed against decode-only (``benchmarks.conversion``)
  python -m benchmarks.codecs ...      every codec's bytes, PSNR and CPU decoding (``benchmarks.codecs``)
  python -m benchmarks.sampling ...    samples of each model's geometry from one conversion, against decoding
                                       the videos on the fly (``benchmarks.sampling``)

``benchmarks.onthefly`` holds ``OnTheFlyVideoDataset``, the decode-per-item
baseline the readers are measured against. Nothing here asserts a figure:
the tables are the output, and docs/benchmarks.md records and explains them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator

# The repository root: where a benchmark's child processes start, so that they can import ``benchmarks``.
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))



@contextlib.contextmanager
def scratch_folder(tmp: str | None, prefix: str) -> Iterator[str]:
    """``tmp`` (a ``--tmp`` option: kept after), or a new temporary folder named ``prefix``..., removed after."""
    folder = tmp or tempfile.mkdtemp(prefix=prefix)
    try:
        yield folder
    finally:
        if tmp is None:
            shutil.rmtree(folder, ignore_errors=True)


__all__ = ["REPO_ROOT", "scratch_folder"]
