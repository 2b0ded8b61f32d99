"""What runs inside a shard process, and what it is given: the plan and its videos, decoding, clip cutting.

The shard process (``shard_worker``), the space check's probe process
(``probe``) and the fork server that starts both (``forkserver``) import
this layer and ``convert.format`` only; see README.md beside this file.
"""
