"""TokenizerBackend: the surface every tokenizer implementation offers its callers.

Two implementations satisfy it: the native Numba encoder
(:class:`~embedserve.tokenizer.tokenizer.Tokenizer`, ``backend`` "native-unigram")
and the Hugging Face ``tokenizers`` library running a tokenizer.json as it is
(:class:`~embedserve.tokenizer.hf_tokenizer.HfTokenizer`, ``backend`` "tokenizers").
``load.load_tokenizer`` picks one; callers (the gateway, ``embedserve tokenize``, the
benchmarks) type against this protocol and never ask which they got, except to report
it (``/info``).

Shared rules, whatever the backend: ids are int32; a batch is an
:class:`~embedserve.tokenizer.encoded.EncodedBatch` (flat ``token_ids`` + ``cu_seqlens``,
``token_type_ids`` when any is non-zero, offsets in characters of the input, specials
at (0, 0)); special tokens come only from the template (text that looks like one is
ordinary text); ``max_length`` counts the specials; pairs are cut longest-first;
bad arguments raise ``InvalidInput``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Protocol, runtime_checkable

import numpy as np

from embedserve.tokenizer.encoded import EncodedBatch
from embedserve.tokenizer.spec import Compat

Truncation = Literal["right", "left"] | None


@runtime_checkable
class TokenizerBackend(Protocol):
    """What the gateway and the CLI use of a loaded tokenizer."""

    @property
    def backend(self) -> str: ...  # "native-unigram", "tokenizers", ...

    @property
    def vocab_size(self) -> int: ...

    @property
    def compat(self) -> Compat: ...

    @property
    def single_specials(self) -> tuple[np.ndarray, np.ndarray]:
        """int32 ids the single-sequence template puts before and after a text."""
        ...

    def id_to_piece(self, token_id: int) -> str: ...

    def encode(self, text: str, add_special_tokens: bool = True) -> np.ndarray: ...

    def encode_batch(self, texts: Sequence[str], max_length: int | None = None,
                     truncation: Truncation = None, add_special_tokens: bool = True,
                     return_offsets: bool = False) -> EncodedBatch: ...

    def encode_pair(self, a: str, b: str, max_length: int | None = None,
                    truncation: Truncation = None, add_special_tokens: bool = True) -> np.ndarray: ...

    def encode_pairs(self, query: str, docs: Sequence[str], max_length: int | None = None,
                     truncation: Truncation = None, add_special_tokens: bool = True,
                     return_offsets: bool = False) -> EncodedBatch: ...

    def tokenize(self, text: str) -> list[str]: ...
