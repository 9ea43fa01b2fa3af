"""Adapters that run embedserve's in-process embedder inside other frameworks.

ray.py: ``EmbedBatches``, a callable class for ``ray.data.Dataset.map_batches``.
Each imports its framework only when used, so embedserve never requires it.
"""
