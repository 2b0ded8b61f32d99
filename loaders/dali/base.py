"""What both DALI routes share: the import of DALI, the executor options, the pipeline's lifetime,
the one translation of a pipeline's errors, and the loader base with its argument checks.

Importing this module imports NVIDIA DALI; where it cannot, the ImportError
says in one line what to install (``loaders.dali.missing()`` asks without
raising).
"""

from __future__ import annotations

try:
    # The DALI modules the routes use are imported here, under one guard, and taken from here.
    import nvidia.dali as dali
    import nvidia.dali.fn as _fn
    import nvidia.dali.math as _dmath
    import nvidia.dali.tfrecord as _tfrec
    import nvidia.dali.types as _types
    from nvidia.dali.backend import TensorGPU
    from nvidia.dali.pipeline import Pipeline
except (ImportError, OSError) as _exc:  # OSError: the wheel is there but a shared library is not
    raise ImportError(f"NVIDIA DALI is not usable here ({type(_exc).__name__}: {_exc}): pip install "
                      f"nvidia-dali-cuda120 (the project's extra: pip install -e '.[dali]'; for CUDA 13, "
                      f"'.[dali-cu13]')") from None

import gc
import weakref
from collections.abc import Sequence
from typing import Any, TypeVar

import numpy as np
import torch

from convert.format import FormatError
from convert.store import ClipStore, open_clips
from convert.store.cache import CacheSettings

from ..presets import ClipPreset
from ..sampler import EpochPosition
from ..sampling import SampleSpec, plan_reads

# A graph is built from DataNodes with arithmetic, indexing and operators whose arguments take DataNodes or
# numbers alike: wider than DALI's stubs describe, so the modules that build graphs are typed as Any.
fn: Any = _fn
dmath: Any = _dmath
tfrec: Any = _tfrec
types: Any = _types

# pipe.run(cuda_stream), which the loaders call, needs DALI's dynamic executor; it became the default in
# DALI 2.4 (NVIDIA/DALI#5936), which is also what the project's tests run.
MIN_DALI = (2, 4)
_FORMAT_ERROR_PREFIX = f"{FormatError.__module__}.{FormatError.__qualname__}: "


def dali_version() -> tuple[int, ...]:
    return tuple(int(p) for p in dali.__version__.split(".")[:2] if p.isdigit())


if dali_version() < MIN_DALI:
    raise ImportError(f"NVIDIA DALI {dali.__version__} is too old: the loaders need >= "
                      f"{'.'.join(map(str, MIN_DALI))} (pip install -e '.[dali]')")


def pipeline_options() -> dict:
    """Executor options every pipeline of this package is built with.

    ``pipe.run(cuda_stream)`` hands outputs over on a CUDA stream only under
    DALI's dynamic executor; older releases default to the legacy one and
    then refuse the stream ("Asynchronous outputs require ...").
    """
    return {"exec_dynamic": True}


class PipeSlot:
    """A loader's current pipeline, closed by ``close()``, when the loader is collected, or at exit.

    The finalizer holds the slot, never the loader, so a dropped loader is
    collected (and its pipeline's threads, worker processes and memory freed)
    even if nobody calls ``close()``.
    """

    def __init__(self, owner: object) -> None:
        self.pipe: Pipeline | None = None
        self._finalizer = weakref.finalize(owner, self.close)

    def close(self) -> None:
        pipe, self.pipe = self.pipe, None
        if pipe is not None:
            pool = getattr(pipe, "_py_pool", None)  # DALI closes it on garbage collection; do it now
            if pool is not None:
                pool.close()
            del pipe
            gc.collect()  # a pipeline can sit in reference cycles: free its threads and memory now


def run_pipeline(pipe: Pipeline, stream: Any, root: str) -> Sequence[Any]:
    """The pipeline's next outputs; any failure a one-line ``FormatError`` naming ``root`` and the cause.

    The one error path of both routes. A FormatError raised in this process
    passes as it is. DALI re-raises an error of a Python worker (the source
    route) as a plain Exception carrying the worker's traceback text, whose
    last FormatError line names the shard and clip; any other failure of the
    pipeline (a record DALI's reader cannot parse) is named by the first line
    of DALI's message that says what went wrong.
    """
    try:
        outputs: Sequence[Any] = pipe.run(stream) if stream is not None else pipe.run()
        return outputs
    except FormatError:
        raise
    except Exception as exc:  # noqa: BLE001 - every failure of a pipeline becomes one line naming the data
        text = str(exc)
        lines = [ln for ln in text.splitlines() if ln.startswith(_FORMAT_ERROR_PREFIX)]
        if lines:
            raise FormatError(lines[-1][len(_FORMAT_ERROR_PREFIX):]) from exc
        stripped = [ln.strip() for ln in text.splitlines() if ln.strip()]
        why = next((ln for ln in stripped if "rror" in ln and "pipeline" not in ln.lower()),
                   stripped[0] if stripped else type(exc).__name__)
        raise FormatError(f"{root}: DALI could not read the conversion: {why}") from exc


def check_gpu(device_id: int | None) -> None:
    """Before a pipeline for ``device_id`` is built: a one-line ValueError when that GPU is not there, where DALI
    would raise a multi-line assertion of its C++ core. Not checked when a loader is made, since a GPU graph can
    be defined (not built) without a GPU, which ``scripts/dali_check.py --smoke`` does to check it."""
    if device_id is None:
        return
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device_id >= gpus:
        seen = "no CUDA GPU" if gpus == 0 else f"{gpus} CUDA GPU(s), device_id 0..{gpus - 1}"
        raise ValueError(f"device_id={device_id} needs a CUDA GPU and torch sees {seen} here: pass device_id=None "
                         f"to run on DALI's CPU backend")


def to_torch(tl: Any, device: torch.device | None, stream: Any) -> torch.Tensor:
    """A dense torch copy of a DALI TensorList: GPU outputs onto ``device`` (on ``stream``), CPU ones via numpy."""
    dense = tl.as_tensor()
    if not isinstance(dense, TensorGPU):
        return torch.from_numpy(np.array(dense))
    from nvidia.dali.plugin.pytorch import feed_ndarray, to_torch_type

    out = torch.empty(dense.shape(), dtype=to_torch_type[dense.dtype], device=device)
    feed_ndarray(dense, out, cuda_stream=stream)
    return out


def check_int(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    return int(value)


_Loader = TypeVar("_Loader", bound="DaliLoaderBase")  # ``with`` gives the loader its own class


class DaliLoaderBase(EpochPosition):
    """What both DALI loaders share: argument checks, the preset, the conversion, the pipeline's lifetime."""

    def _setup(self, root: str, *, train: bool, batch_size: int, preset: ClipPreset | None, rank: int,
               world_size: int, device_id: int | None, seed: int, prefetch: int, normalize: bool,
               cache: CacheSettings | None = None, spec: SampleSpec | None = None) -> None:
        if not isinstance(train, bool):
            raise ValueError(f"train must be True or False, got {train!r}")
        batch_size = check_int("batch_size", batch_size, 1)
        world_size = check_int("world_size", world_size, 1)
        rank = check_int("rank", rank, 0)
        if rank >= world_size:
            raise ValueError(f"rank must be in 0..{world_size - 1}, got {rank}")
        seed = check_int("seed", seed, 0)
        prefetch = check_int("prefetch", prefetch, 1)
        if device_id is not None:
            device_id = check_int("device_id", device_id, 0)
        if not isinstance(normalize, bool):
            raise ValueError(f"normalize must be True or False, got {normalize!r}")
        if preset is None:
            preset = ClipPreset(train=train, seed=seed)
        elif not isinstance(preset, ClipPreset):
            raise ValueError(f"preset must be a ClipPreset or None, got {type(preset).__name__}")
        elif preset.train != train:
            raise ValueError(f"train={train} but the preset has train={preset.train}")
        elif seed not in (0, preset.seed):
            # One seed keys both the order and the crops, as on the LMDB path.
            raise ValueError(f"seed={seed} disagrees with the preset's seed {preset.seed}")
        self.root = root
        self.train = train
        self.seed = preset.seed
        self.batch_size = batch_size
        self.rank, self.world_size = rank, world_size
        self.device_id = device_id
        self.device = torch.device("cuda", device_id) if device_id is not None else None
        self.prefetch = prefetch
        self.normalize = normalize
        self.store: ClipStore = open_clips(root, cache=cache)  # a URL: through the shard cache
        self.classes: list[str] = list(self.store.classes)
        self.codec: str = self.store.manifest.data.codec  # the manifest's name; the codec object is store.codec
        plan = plan_reads(self.store, preset, spec, train=train)  # a crop that cannot fit fails here, not in DALI
        self.spec, self.preset, self.samples = plan.spec, plan.preset, plan.samples
        shape = self.store.manifest.data.clip_shape
        self._stored_frames = self.store.manifest.data.clip.clip_len
        self._stored_shape = tuple(shape) if shape else None
        self.clip_shape: tuple[int, int, int, int] = self.preset.out_shape(plan.frames)
        self.epoch = 0
        self.position = 0
        self._slot = PipeSlot(self)
        self._token = 0  # which iterator may read the pipeline

    @property
    def _pipe(self) -> Pipeline | None:
        return self._slot.pipe

    @property
    def num_clips(self) -> int:
        """Clips in the conversion (all ranks)."""
        return len(self.store)

    def close(self) -> None:
        """Stop the pipeline, its threads and worker processes (a later iteration builds a new one)."""
        self._slot.close()

    def __enter__(self: _Loader) -> _Loader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        where = "cpu" if self.device_id is None else f"cuda:{self.device_id}"
        return (f"{type(self).__name__}({self.root!r}, {self.codec}, {self.num_clips} clips, rank {self.rank}/"
                f"{self.world_size}, batch {self.batch_size}, {where}, epoch {self.epoch}, "
                f"position {self.position}, {self.preset})")


__all__ = ["MIN_DALI", "DaliLoaderBase", "Pipeline", "PipeSlot", "check_gpu", "check_int", "dali", "dali_version",
           "dmath", "fn", "pipeline_options", "run_pipeline", "tfrec", "to_torch", "types"]
