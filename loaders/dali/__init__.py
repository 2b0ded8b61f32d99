"""The NVIDIA DALI loaders: decode, crop, flip and normalise on the GPU (or on DALI's CPU backend).

Two routes to one kind of batch:

- ``DaliClipLoader`` (``loaders.dali.source``): any backend, through
  ``fn.external_source``, in ``DistributedClipSampler``'s order with the
  ``ClipPreset``'s crops: the same pixels as ``ClipDataset``.
- ``DaliTFRecordLoader`` (``loaders.dali.native``): TFRecord conversions,
  read by DALI's own ``fn.readers.tfrecord``; no Python touches a sample.

``build_dali_loader`` picks the route from the conversion. ``missing()``
says whether DALI is usable here (importing this package imports no DALI;
the loaders import it, and say in one line what to install when it is not
there). ``loaders.dali.base`` holds what the routes share,
``loaders.dali.graphs`` how each kind of payload is decoded, and
``loaders.dali.sharding`` (no DALI import) the batches of an epoch, padded or
not, which the trainer counts with too.
"""

from __future__ import annotations

import importlib
from typing import Any

from convert.format.system import lazy_exports
from convert.store import manifest_at

_LAZY = {"DaliClipLoader": "source", "DaliTFRecordLoader": "native"}
__getattr__ = lazy_exports(__name__, _LAZY)

ROUTES = ("auto", "native", "source")


def missing() -> str | None:
    """Why the DALI loaders cannot be used here (one line saying what to install), or None when they can."""
    try:
        importlib.import_module(f"{__name__}.base")
    except ImportError as exc:
        return str(exc)
    return None


def route_for(root: str, route: str = "auto") -> str:
    """The route ``build_dali_loader`` takes for ``root``: ``route``, or for ``"auto"`` the native route on a
    TFRecord conversion and the source route on the others (the trainer sizes its epochs by it: the native
    route pads the last batch, ``loaders.dali.sharding``)."""
    if route not in ROUTES:
        raise ValueError(f"route must be one of {', '.join(ROUTES)}, got {route!r}")
    if route != "auto":
        return route
    return "native" if manifest_at(root).data.backend == "tfrecord" else "source"


def build_dali_loader(root: str, *, train: bool, batch_size: int, preset: Any = None, rank: int = 0,
                      world_size: int = 1, device_id: int | None = None, seed: int = 0, workers: int | None = 2,
                      route: str = "auto", verify: bool = False, **kw: Any) -> Any:
    """The trainer's DALI loader for ``root``, with the trainer's keyword names.

    ``route``: ``"native"`` is ``DaliTFRecordLoader`` (DALI's own TFRecord
    reader; ``workers`` = DALI's CPU threads, at least 1), ``"source"`` is
    ``DaliClipLoader`` (``fn.external_source``, sampler order, ``workers``
    Python worker processes, ``None``: 2), ``"auto"`` the native route for
    TFRecord conversions and the source route for the others. ``verify``:
    check each value's CRC-32 as it is read (the source route only: DALI's
    TFRecord reader hands the bytes to the GPU without Python seeing them, so
    the native route refuses it with a ValueError). Other keywords go to the
    loader chosen.
    """
    route = route_for(root, route)
    common = {"train": train, "batch_size": batch_size, "preset": preset, "rank": rank, "world_size": world_size,
              "device_id": device_id, "seed": seed}
    if route == "native":
        if verify:
            raise ValueError("verify=True (the trainer's --verify-data) needs the source route (route='source') "
                             "or another loader (--loader threads): DALI's own TFRecord reader passes the bytes "
                             f"to the GPU unseen by Python; python -m convert verify {root} checks them all")
        from .native import DaliTFRecordLoader

        return DaliTFRecordLoader(root, threads=max(1, workers or 1), **common, **kw)
    from .source import DaliClipLoader

    return DaliClipLoader(root, workers=2 if workers is None else workers, verify=verify, **common, **kw)


__all__ = ["ROUTES", "DaliClipLoader", "DaliTFRecordLoader", "build_dali_loader", "missing", "route_for"]
