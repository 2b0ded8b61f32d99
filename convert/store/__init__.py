"""Shard access: reading a conversion from a folder or a URL, the shard cache, remote storage, the verifier.

Beside the format (``convert.format``), which it reads through and which
imports nothing of it. Modules: ``store`` (the plain reader: ``open_clips``,
``ClipStore``, ``manifest_at``), ``source`` (where a shard's files come
from: a folder, or the shard cache of a URL), ``cache`` (the local shard
cache, a subpackage), ``remote`` (URLs through fsspec, imported on first
use), ``verify`` (the shard verifier) and ``upload`` (a finished conversion
uploaded to a URL). Importing it imports neither PyAV, torch nor fsspec.
"""

from __future__ import annotations

from .cache.settings import CacheSettings
from .remote import RemoteError, is_url
from .store import ClipSample, ClipStore, manifest_at, open_clips

__all__ = ["CacheSettings", "ClipSample", "ClipStore", "RemoteError", "is_url", "manifest_at", "open_clips"]
