"""``python -m benchmarks.loaders``: clips/s of every reader on the same synthetic clips, in one run.

Run from the repository root. It builds (or reuses, under ``--root``)
synthetic videos and their raw, lz4 and jpeg conversions on both backends
(and h264 and vp9 on LMDB), then times random 112 crops of 16-frame clips at one batch size: through
``build_loader`` with 0, 1 and 2 DataLoader workers and with 1, 2 and
one-per-core reader threads (``threads=N``); ``--sections engines`` adds the
threaded reads on torchdata.nodes and SPDL against the hand-written pool:

  on-the-fly   OnTheFlyVideoDataset: PyAV decode in __getitem__ (the baseline)
  lmdb raw/lz4/jpeg   ClipDataset on each codec's LMDB shards
  lmdb h264/vp9   the same on the video codecs' (FFmpeg's decoding on the CPU)
  dali native raw/jpeg   DaliTFRecordLoader on the TFRecord shards: DALI's own
               reader, decoder and crop on DALI's CPU backend (here "workers"
               are DALI's CPU threads, at least 1; each epoch's first batch,
               which builds the epoch's pipeline and fills its shuffle buffer,
               is not timed)
  tfrecord-pkg raw/jpeg  the ``tfrecord`` package's reader over the same
               record files in DataLoader workers (files split between them),
               decoded and cropped per clip in Python: TFRecord without DALI
  read+copy    every raw payload read from LMDB and copied into a batch buffer,
               nothing else: the bound for any reader of these shards

then a table of bytes on disk per clip for every backend and codec against
the source videos' bytes. Each configuration runs for ``--seconds`` after its
first batch (worker start-up is not timed), ``--rounds`` times, interleaved;
the best run is kept. The shards were just written, so they sit in the page
cache: this measures CPU cost, not disk. ``--sections cold`` reads every
clip once from shards dropped from the page cache first, against the same
reads warm, and LMDB with the kernel's read-around off (what the readers did
before). ``--sections smallcache`` reads every clip once through a page cache
smaller than the shards (a memory cgroup; needs root), in the sampler's random
order against its block-shuffled order (``order="blocks"``). Nothing is
asserted; the tables are the output (docs/benchmarks.md discusses them).

One module per section: ``dataloader`` (DataLoader workers, and the bytes on
disk), ``threads`` (reader threads), ``engines`` (thread-based loading
libraries), ``cold`` (reads from storage), ``smallcache`` (a page cache
smaller than the shards); ``common`` holds what several of them share (the
data, the timing, the interleaved rounds) and ``__main__`` the command line.
"""
