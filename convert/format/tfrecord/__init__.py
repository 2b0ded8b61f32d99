"""The TFRecord backend: ``tf.train.Example`` records in files that DALI, TensorFlow and the ``tfrecord`` package read.

A shard is a folder (FORMAT.md, *TFRecord shards*):
  ``shard.json``              the shard's metadata (as LMDB's ``m/shard``)
  ``part-NNNNN.tfrecord``     records, one per clip; a new part starts once one reaches the target size
  ``part-NNNNN.idx``          DALI's index: "offset length" per record (what ``tfrecord2idx`` writes)
  ``part-NNNNN.json``         the part's commit: its video records; written last (``convert.format.parts``)
  ``complete.json``           the summary, once the shard is finished

Modules: ``wire`` (record framing, the Example wire format), ``schema`` (the
features, defined once), ``writer``, ``reader``, ``options``.
"""

from __future__ import annotations

from .options import TFRecordOptions
from .reader import TFRecordReader
from .writer import TFRecordWriter

__all__ = ["TFRecordOptions", "TFRecordReader", "TFRecordWriter"]
