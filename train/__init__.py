"""C3D training on converted clip shards: ``python -m train`` or ``torchrun ... -m train``.

Modules: ``model`` (C3D), ``dist`` (process group), ``data`` (loaders seam),
``schedule`` (optimizer and learning rate), ``checkpoint`` (atomic save, exact
resume), ``engine`` (train_one_epoch, evaluate), ``metrics`` (evaluation
numbers, JSON lines, TensorBoard), ``plots`` (PNG figures), ``autobatch``
(``--batch-size auto``), ``args`` (command line), ``config`` (the run's
frozen ``TrainConfig``, resolved once from it), ``main``, ``evalcmd`` and ``demo``
(synthetic data comes from ``convert.synth.synthetic_conversions``).
"""

from .errors import TrainError

__all__ = ["TrainError"]
