"""``embedserve tokenize``: print the ids and pieces of a text (a quick look at a tokenizer).

Lives beside the default model's builder because, like every serving command,
it tokenizes with the default model when no ``--model`` is given.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from embedserve.defaults.model_args import add_model_arguments, model_dir_from_args
from embedserve.errors import EmbedServeError

# The tokenizer (Numba and its kernels) is imported by run(), not here: every
# `embedserve` process builds this parser, and a replica never tokenizes with it.


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "tokenize", help="print the token ids and pieces of a text",
        description="Tokenize TEXT with a tokenizer.json, a SentencePiece .model, or a model "
                    "directory, and print ids and pieces.")
    parser.add_argument("text", help="the text to tokenize")
    add_model_arguments(parser, "tokenizer.json, a .model file, or a model directory (default: "
                                "multilingual-e5-small, built on first use into --cache-dir)")
    parser.add_argument("--compat", choices=["hf", "sentencepiece"], default=None,
                        help="match tokenizers (hf, default for tokenizer.json and model "
                             "directories) or sentencepiece (default for a .model file)")
    parser.add_argument("--no-special", action="store_true",
                        help="leave out the special tokens (<s> / </s>, [CLS] / [SEP])")
    parser.add_argument("--offsets", action="store_true", help="also print character offsets")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--trie-cache-dir", type=Path, default=None,
                        help="where built tries are cached (default: ~/.cache/embedserve/tokenizer)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from embedserve.tokenizer.load import load_tokenizer, load_tokenizer_file
    from embedserve.tokenizer.tokenizer import DEFAULT_CACHE_DIR

    model = model_dir_from_args(args)
    cache_dir = DEFAULT_CACHE_DIR if args.trie_cache_dir is None else args.trie_cache_dir
    try:
        if model.is_dir():
            tokenizer = load_tokenizer(model, compat=args.compat or "hf", cache_dir=cache_dir)
        else:
            tokenizer = load_tokenizer_file(model, compat=args.compat, cache_dir=cache_dir)
        batch = tokenizer.encode_batch([args.text], add_special_tokens=not args.no_special,
                                       return_offsets=args.offsets)
    except EmbedServeError as exc:
        print(f"error: {exc.message}")
        return 2
    ids = batch.sequence(0).tolist()
    pieces = [tokenizer.id_to_piece(i) for i in ids]
    if args.json:
        out = {"ids": ids, "pieces": pieces}
        if args.offsets:
            out["offsets"] = batch.sequence_offsets(0).tolist()
        print(json.dumps(out, ensure_ascii=False))
        return 0
    print("ids:   ", " ".join(map(str, ids)))
    print("pieces:", " ".join(pieces))
    if args.offsets:
        print("offsets:", " ".join(f"{s}:{e}" for s, e in batch.sequence_offsets(0).tolist()))
    return 0
