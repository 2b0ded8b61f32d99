"""``verify`` of a conversion at a URL: each shard through the shard cache, then checked as a folder's are."""

from __future__ import annotations

from convert.format.errors import FormatError
from convert.format.manifest import check_plan
from convert.format.system import cpu_count

from ..verify import Check, checked_counts, isolated, shard_check, totals_problems
from .cache import ShardCache
from .settings import CacheSettings


def verify_url(url: str, *, decode: bool = True, workers: int | None = None,
               cache: CacheSettings | None = None, fingerprint: str | None = None) -> tuple[list[str], dict]:
    """``verify`` of the conversion at ``url``: all problems (empty when it is sound), and the counts checked.

    Each shard is downloaded into the shard cache (``cache``: its settings),
    checked on arrival, then decoded in full in a child process as a folder's
    shards are; a few at a time, so the disk holds the cache's limit at most;
    the shards stay cached. A network failure or a full cache disk
    (``RemoteError``) is raised, never reported as a problem of the data.
    ``fingerprint``: as ``verify``'s.
    """
    workers = cpu_count() if workers is None else workers
    try:
        sc = ShardCache(url, cache)
    except FormatError as exc:
        return [str(exc)], {}
    manifest = sc.manifest
    problems: list[str] = []
    try:
        sc.mirror_plan()
        check_plan(sc.dir, manifest, digest=True)  # the mirror holds the URL's plan.json, when there is one
    except FormatError as exc:
        problems.append(str(exc).replace(sc.dir, sc.url))
    # As many shards at once as there are workers and the cache holds.
    at_once = max(1, min(workers, sc.limit // max(max(sc.sizes, default=1), 1) - 1))
    order = list(range(len(manifest.shards)))
    for start in range(0, len(order), at_once):
        holds = {}
        try:
            for i in order[start:start + at_once]:
                try:
                    holds[i] = sc.acquire(i)  # downloaded and checked on arrival unless cached
                except FormatError as exc:
                    problems.append(str(exc))
            tasks: list[tuple[str, Check]] = [
                (manifest.shards[i].name, shard_check(sc.local_path(i), i, manifest, decode)) for i in holds]
            found = isolated(tasks, workers)
        finally:
            for hold in holds.values():
                hold.release()
        for line in found:
            for i in holds:
                line = line.replace(sc.local_path(i), sc.shard_url(i))
            problems.append(line)
    problems += totals_problems(manifest, f"{sc.url}/manifest.json", fingerprint)
    return problems, checked_counts(manifest)


__all__ = ["verify_url"]
