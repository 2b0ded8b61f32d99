"""The project's benchmarks: scripts that measure, never part of the installed packages.

Run them from the repository root (the folder holding ``benchmarks/``,
``convert/`` and ``loaders/``), so that ``benchmarks`` is importable:

  python -m benchmarks.loaders ...     clips/s of every reader (``benchmarks.loaders``)
  python -m benchmarks.conversion ...  conversion speed against decode-only (``benchmarks.conversion``)

``benchmarks.onthefly`` holds ``OnTheFlyVideoDataset``, the decode-per-item
baseline the readers are measured against. Nothing here asserts a figure:
the tables are the output, and docs/benchmarks.md records and explains them.
"""

from __future__ import annotations

import os

# The repository root: where a benchmark's child processes start, so that they can import ``benchmarks``.
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

__all__ = ["REPO_ROOT"]
