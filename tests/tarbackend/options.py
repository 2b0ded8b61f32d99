"""How the tar backend stores (never what): whether each video's commit is synced."""

from __future__ import annotations

from dataclasses import dataclass

from convert.format.options import check_settings, option


@dataclass(frozen=True)
class TarOptions:
    """Writing options of the tar backend, declared as the built-in backends declare theirs."""

    sync: bool = option("tar", "tar: sync the archive and its index at every video's commit, not only at the "
                               "shard's end (survives a crash of the machine, not only of the process)",
                        default=False, flag="--tar-sync", field_default=True)

    def __post_init__(self) -> None:
        check_settings(self, ValueError)
        if not isinstance(self.sync, bool):
            raise ValueError(f"sync must be True or False, got {self.sync!r}")
