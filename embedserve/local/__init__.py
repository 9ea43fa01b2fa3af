"""Embedding many texts inside this process, without the servers.

Owns what the bulk command (``embedserve.bulk``) and the Ray integration
(``embedserve.integrations.ray``) share: the rules a document must pass
(``documents.py``), the packing of a part into token-budget batches
(``packing.py``), the output precisions (``precision.py``), the output
columns (``columns.py``) and the ``LocalEmbedder`` that tokenizes and steps
the engine (``embedder.py``). Knows nothing about files, manifests or HTTP.
"""
