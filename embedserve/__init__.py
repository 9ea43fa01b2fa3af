"""embedserve: a serving stack for transformer embedding and reranking models.

Three tiers in one package: ``tokenizer`` (exact Unigram encoder),
``engine`` (packed PyTorch encoders), ``scheduler`` (gRPC token-budget
batching) and ``gateway`` (OpenAI/TEI-compatible HTTP). See DESIGN.md.
"""

__version__ = "0.1.0"
