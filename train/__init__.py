"""Training video networks on converted clip shards: ``python -m train`` or ``torchrun ... -m train``.

Modules: ``models`` (the networks: C3D, torchvision's video ResNets, I3D-R50;
the registry behind ``--model`` and ``build_model``), ``dist`` (process group), ``options`` (declaring a
setting once: its option, its checks), ``config`` (the run's frozen
``TrainConfig``, on whose fields every option is declared), ``args`` (the
command line, and ``resolve_config``: options, machine and data into a
config), ``data`` (building the loaders: the seam to ``loaders``),
``protocols`` (evaluation protocols), ``readerrors`` (reader errors as
one-line TrainErrors), ``workers`` (DataLoader worker processes' signals and
exit), ``schedule`` (optimizer and learning rate), ``checkpoint`` (atomic
save, exact resume), ``engine`` (train_one_epoch, evaluate), ``metrics``
(evaluation numbers, JSON lines, TensorBoard), ``plots`` (PNG figures),
``autobatch`` (``--batch-size auto``), ``gpustats`` and ``profiling``,
``main``, ``evalcmd`` and ``demo`` (synthetic data comes from
``convert.synth.synthetic_conversions``), and ``commands`` (which of them
``python -m train`` runs).
"""

from .errors import TrainError

__all__ = ["TrainError"]
