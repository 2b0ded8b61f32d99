"""How the tar backend stores (never what): whether each video's commit is synced."""

from __future__ import annotations

from dataclasses import dataclass

from convert.format.base import option


@dataclass(frozen=True)
class TarOptions:
    """Writing options of the tar backend."""

    sync: bool = option(False, flag="--tar-sync", parse="switch",
                        help="tar: sync the archive and its index at every video's commit, not only at the shard's "
                             "end (survives a crash of the machine, not only of the process)")

    def __post_init__(self) -> None:
        if not isinstance(self.sync, bool):
            raise ValueError(f"sync must be True or False, got {self.sync!r}")
