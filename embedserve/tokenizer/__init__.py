"""Exact SentencePiece-Unigram (XLM-R family) and WordPiece (BERT family) tokenization, in Numba.

``Tokenizer.from_file`` / ``Tokenizer.from_model_dir`` load a ``.model``, a
``tokenizer.json`` (Unigram or WordPiece) or a BERT ``vocab.txt`` directory; ``encode``, ``encode_batch``, ``encode_pair`` and ``encode_pairs``
return int32 ids (batches as an :class:`EncodedBatch`, a ``RaggedBatch`` with the
tokenizer's extras). Stages: spec.py (what a tokenizer is), formats/ (model_proto.py /
hf_json.py / wordpiece_json.py / bert_vocab.py loaders, charsmap.py), kernels/
(normalize_sp.py / normalize_hf.py, trie.py, viterbi.py, encode.py; normalize_bert.py,
wordpiece.py), templates.py (specials, truncation, segment ids), wordpiece.py (the
WordPiece encoder the Tokenizer delegates to), tokenizer.py.
"""

from embedserve.tokenizer.encoded import EncodedBatch
from embedserve.tokenizer.tokenizer import Tokenizer

__all__ = ["EncodedBatch", "Tokenizer"]
