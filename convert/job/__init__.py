"""The conversion job in the job process: the output folder, the shards' supervision and scheduling, reruns,
progress, report and manifest (``run.run_job``).

It imports ``convert.worker`` and ``convert.format`` below it, never the
commands above it; see README.md beside this file.
"""
