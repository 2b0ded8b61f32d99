"""Training video networks on converted clip shards: ``python -m train`` or ``torchrun ... -m train``.

The map of its modules is ``train/README.md``; the networks are ``train.models`` (``train/models/README.md``).
"""

from .errors import TrainError

__all__ = ["TrainError"]
