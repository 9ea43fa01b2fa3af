"""Exact SentencePiece-Unigram tokenization for XLM-R-family models, in Numba.

``Tokenizer.from_file`` / ``Tokenizer.from_model_dir`` load a ``.model`` or
``tokenizer.json``; ``encode``, ``encode_batch``, ``encode_pair`` and ``encode_pairs``
return int32 ids (batches packed as an :class:`EncodedBatch`). Stages: spec.py (what a
tokenizer is), model_proto.py / hf_json.py (loaders), charsmap.py, normalize_sp.py /
normalize_hf.py, trie.py, viterbi.py, encoder.py, packing.py, tokenizer.py.
"""

from embedserve.tokenizer.encoded import EncodedBatch
from embedserve.tokenizer.tokenizer import Tokenizer

__all__ = ["EncodedBatch", "Tokenizer"]
