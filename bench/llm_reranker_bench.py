"""CPU benchmark: a Qwen3-Reranker-shaped LLM reranker, embedserve vs sentence-transformers' CrossEncoder.

A random ``Qwen3ForCausalLM`` with Qwen3-Reranker-0.6B's geometry (hidden 1024,
16 query / 8 key-value heads of 128, q/k norms, SwiGLU 3072, vocabulary 151,669
tied to the embeddings; 28 layers in the real model, ``--layers`` of them here),
fp32, and a byte-level BPE tokenizer trained here on Python's documentation with
Qwen's split pattern and chat markers (``yes`` and ``no`` single tokens), written
to a temporary directory with no sentence-transformers files, as the
Qwen/Qwen3-Reranker-* folders ship. Both sides score one query against 32
documents of word counts log-uniform in 4..300, in the model card's prompt
(model/llm_reranker.py), one call per batch as a server receives a rerank:

- embedserve: the gateway's prompt assembly (prefix ids + the native tokenizer's ids
  of the formatted pair + suffix ids), one packed ``Engine.step`` (no padding; the
  score row ``w_yes - w_no`` at each sequence's last token), then the sigmoid;
- sentence-transformers: ``CrossEncoder(folder).predict(pairs, batch_size=32)``, which
  loads a causal LM as a yes/no reranker (``LogitScore``: left padding,
  ``logits_to_keep=1``, ``logit_yes - logit_no``, sigmoid); the pair is split as
  (prefix + instruction + query, document + suffix), which gives the model card's
  scores.

Time is process CPU time with one torch thread (bench/mixed_lengths.py): read the
ratio, which both sides' share of a noisy machine moves alike, not the rates.
tokens/s counts embedserve's prompt tokens, the same for both sides.

    python -m bench llm_reranker [--layers 28] [--repeats 2] [--documents 32]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np
import torch

from bench.mixed_lengths import best_cpu_seconds, mixed_texts, speedup_table

QWEN3_RERANKER_0_6B = dict(vocab_size=151669, hidden_size=1024, num_attention_heads=16, num_key_value_heads=8,
                           head_dim=128, intermediate_size=3072, max_position_embeddings=40960,
                           rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)
# A smaller model with the same ratios (heads of 128, 2:1 grouped query attention,
# FFN 3x hidden), for the smoke test.
TINY = dict(vocab_size=4096, hidden_size=256, num_attention_heads=4, num_key_value_heads=2,
            head_dim=64, intermediate_size=768, max_position_embeddings=4096,
            rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)
# Qwen2/Qwen3's pre-tokenizer pattern, and their chat markers as added tokens.
QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]


def build(directory: Path, shape: dict, layers: int, vocab: int) -> None:
    """The random causal LM and its tokenizer, as a Qwen3-Reranker folder holds them."""
    from pydoc_data.topics import topics

    import tokenizers
    import transformers
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tokenizer = tokenizers.Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(tokenizers.Regex(QWEN_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tokenizer.decoder = decoders.ByteLevel()
    lines = list(topics.values()) + ["yes", "no", "yes no"] * 200
    tokenizer.train_from_iterator(lines, trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=SPECIALS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
        "model_max_length": 8192, "padding_side": "left"}))
    config = transformers.Qwen3Config(**shape, num_hidden_layers=layers, pad_token_id=0,
                                      bos_token_id=0, eos_token_id=2)
    torch.manual_seed(0)
    transformers.Qwen3ForCausalLM(config).eval().save_pretrained(directory, safe_serialization=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=28, help="decoder layers (Qwen3-Reranker-0.6B: 28)")
    parser.add_argument("--repeats", type=int, default=2, help="timed batches per side")
    parser.add_argument("--documents", type=int, default=32, help="documents per rerank call")
    parser.add_argument("--tiny", action="store_true",
                        help="hidden 256 and a 4,096-token vocabulary instead of the 0.6B geometry (smoke test)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    from sentence_transformers import CrossEncoder

    from embedserve.engine import Batch, Engine
    from embedserve.model import llm_reranker
    from embedserve.model.info import read_model_info
    from embedserve.model.postprocess import sigmoid
    from embedserve.tokenizer.load import load_tokenizer

    shape = TINY if args.tiny else QWEN3_RERANKER_0_6B
    rng = np.random.default_rng(0)
    query = " ".join(mixed_texts(1, rng, fewest=6, most=12))
    documents = mixed_texts(args.documents, rng)
    with tempfile.TemporaryDirectory(prefix="llm-reranker-bench-") as tmp:
        directory = Path(tmp)
        build(directory, shape, args.layers, vocab=4000 if args.tiny else 32000)
        info = read_model_info(directory)
        assert info.pair_template == llm_reranker.TEMPLATE_NAME, "the folder must load as a yes/no reranker"
        tokenizer = load_tokenizer(directory)
        markers = dict(info.prompt_markers)

        def encode(texts):
            batch = tokenizer.encode_batch(list(texts), add_special_tokens=False)
            return [batch.sequence(i) for i in range(batch.num_sequences)]

        prefix = llm_reranker.encode_with_markers(llm_reranker.PREFIX, markers, encode)
        suffix = llm_reranker.encode_with_markers(llm_reranker.SUFFIX, markers, encode)
        head = f"<Instruct>: {llm_reranker.DEFAULT_INSTRUCTION}\n<Query>: {query}\n"
        pairs = [(llm_reranker.PREFIX + head, f"<Document>: {doc}{llm_reranker.SUFFIX}") for doc in documents]
        cross_encoder = CrossEncoder(str(directory), device="cpu")
        with Engine.load(directory) as engine:
            def ours() -> np.ndarray:
                # What the gateway does per rerank call (gateway/preprocess.py), then the replica's step.
                body = encode([llm_reranker.format_pair(query, doc) for doc in documents])
                sequences = [np.concatenate([prefix, ids, suffix]).astype(np.int32) for ids in body]
                return sigmoid(engine.step(Batch.from_sequences(sequences, "score")).wait())

            def theirs() -> np.ndarray:
                return cross_encoder.predict(pairs, batch_size=32, convert_to_numpy=True)

            tokens = sum(len(prefix) + len(ids) + len(suffix)
                         for ids in encode([llm_reranker.format_pair(query, d) for d in documents]))
            difference = float(np.abs(ours() - theirs()).max())                     # warm-up, and a check
            engine_s = best_cpu_seconds(ours, args.repeats)
            reference_s = best_cpu_seconds(theirs, args.repeats)
    geometry = "hidden 256, vocabulary 4,096 (--tiny)" if args.tiny else "Qwen3-Reranker-0.6B's geometry"
    import sentence_transformers

    print(f"Qwen3 yes/no reranker ({geometry}, {args.layers} layers, random weights, fp32), one query and "
          f"{args.documents} mixed documents ({tokens} prompt tokens), 1 thread, CPU seconds per call "
          f"(best of {args.repeats}); sentence-transformers {sentence_transformers.__version__} CrossEncoder; "
          f"max |score difference| {difference:.2e}")
    print(speedup_table("mixed", tokens, engine_s, reference_s), flush=True)
    return 0
