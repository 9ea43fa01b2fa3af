"""``embedserve embed``: embed a corpus of files into Parquet (or .npy), resumably.

reader.py (files -> parts of N rows, streaming), job.py (the job's parameters
and its output paths), manifest.py (which parts are finished, written
atomically), writer.py (part files, the final output, the errors file),
remote.py (the same job through a running gateway), run.py (the pipeline:
read and tokenize ahead, compute, write behind), progress.py (the bar and the
summary), ray_job.py (``--ray``: the same job on a Ray cluster), cli.py.
The model work itself is ``embedserve.local``'s.
"""
