"""Exact SentencePiece-Unigram tokenization for XLM-R-family models, in Numba.

``Tokenizer.from_file`` / ``Tokenizer.from_model_dir`` load a ``.model`` or
``tokenizer.json``; ``encode``, ``encode_batch``, ``encode_pair`` and ``encode_pairs``
return int32 ids (batches as an :class:`EncodedBatch`, a ``RaggedBatch`` with the
tokenizer's extras). Stages: spec.py (what a tokenizer is), formats/ (model_proto.py /
hf_json.py loaders, charsmap.py), kernels/ (normalize_sp.py / normalize_hf.py, trie.py,
viterbi.py, encode.py), templates.py (specials, truncation), tokenizer.py.
"""

from embedserve.tokenizer.encoded import EncodedBatch
from embedserve.tokenizer.tokenizer import Tokenizer

__all__ = ["EncodedBatch", "Tokenizer"]
