"""Tokenization: exact SentencePiece-Unigram (XLM-R family) and WordPiece (BERT family) in
Numba, and ``tokenizers`` for the rest.

``load.load_tokenizer`` / ``load.load_tokenizer_file`` pick the implementation for a
model directory or file and return a ``backend.TokenizerBackend``: the native
:class:`Tokenizer` (a ``.model``, a Unigram or WordPiece ``tokenizer.json``, or a BERT
``vocab.txt`` directory) or :class:`HfTokenizer` (any other tokenizer.json, run by the
``tokenizers`` library). ``encode``, ``encode_batch``, ``encode_pair`` and
``encode_pairs`` return int32 ids (batches as an :class:`EncodedBatch`, a ``RaggedBatch``
with the tokenizer's extras). Native stages: spec.py (what a tokenizer is), formats/
(model_proto.py / hf_json.py / wordpiece_json.py / bert_vocab.py loaders, charsmap.py),
kernels/ (normalize_sp.py / normalize_hf.py, trie.py, viterbi.py, encode.py;
normalize_bert.py, wordpiece.py), templates.py (specials, truncation, segment ids),
wordpiece.py (the WordPiece encoder the Tokenizer delegates to), tokenizer.py.
"""

from embedserve.tokenizer.backend import TokenizerBackend
from embedserve.tokenizer.encoded import EncodedBatch
from embedserve.tokenizer.hf_tokenizer import HfTokenizer
from embedserve.tokenizer.load import load_tokenizer, load_tokenizer_file
from embedserve.tokenizer.tokenizer import Tokenizer

__all__ = ["EncodedBatch", "HfTokenizer", "Tokenizer", "TokenizerBackend", "load_tokenizer",
           "load_tokenizer_file"]
