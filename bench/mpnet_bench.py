"""CPU benchmark: an MPNet at all-mpnet-base-v2's shape, embedserve vs sentence-transformers.

A random MPNet with all-mpnet-base-v2's sizes (hidden 768, 12 layers, 12 heads,
FFN 3072, vocabulary 30527, 514 positions; ``--layers`` to run fewer), a
WordPiece tokenizer trained here on Python's own documentation, and mean
pooling + Normalize is written to a temporary directory. Both sides go from
the same texts to normalized vectors in one call per batch, as a server
receives them:

- embedserve: its tokenizer (native WordPiece), one packed ``Engine.step``
  (fused oneDNN layers, per-sequence attention with MPNet's relative bias), then
  normalization;
- sentence-transformers: ``SentenceTransformer.encode(texts, batch_size=32)``
  (its own length sorting and padding, transformers' MPNetModel).

Scenario ``mixed``: 32 texts of word counts drawn log-uniformly from 4 to 300 (cut to
at most 384 tokens, sentence-transformers' ``max_seq_length``).
Time is process CPU time with one torch thread (``time.process_time``), which
other processes' load barely moves; tokens/s counts the tokens embedserve's
tokenizer produced (specials included), the same for both sides.

    python -m bench mpnet [--layers 12] [--repeats 2]
    python -m bench mpnet --bias-ab [--threads 2] [--repeats 20] [--model-dir DIR]

``--bias-ab`` times instead where MPNet's relative position bias is added in bf16 (torch's
threads, ``--threads``): on the native attention kernel (modules/mpnet.py's
``per_sequence_native``, and small steps' flat loop for steps of up to 64 tokens) against
one SDPA per sequence with the bias as its mask (``per_sequence_biased``, the general path:
what every MPNet step ran before, and what runs where the kernel does not). One engine as
served, the other with ``small_steps=False`` and its model's ``native_attention`` off, the
two taking turns; wall ms per step (median), for the 32 mixed texts in one step and for
single texts of 8 and 32 tokens. ``--model-dir`` writes the model there (once) and keeps
it, for serving it: ``python -m bench overhead --stack ". --model DIR"``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np
import torch

from bench.mixed_lengths import alternating_step_ms, best_cpu_seconds, mixed_texts, speedup_table


def build(directory: Path, layers: int) -> None:
    """The model, a WordPiece tokenizer.json and sentence-transformers' metadata."""
    from pydoc_data.topics import topics

    import transformers
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )

    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    specials = ["<s>", "<pad>", "</s>", "[UNK]", "<mask>"]          # all-mpnet-base-v2's order: <pad> = 1
    tokenizer.train_from_iterator(topics.values(), trainers.WordPieceTrainer(vocab_size=30527,
                                                                             special_tokens=specials))
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", 0), ("</s>", 2)])
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "cls_token": "<s>", "sep_token": "</s>", "pad_token": "<pad>", "unk_token": "[UNK]",
        "mask_token": "<mask>", "model_max_length": 512}))
    config = transformers.MPNetConfig(vocab_size=30527, hidden_size=768, num_hidden_layers=layers,
                                      num_attention_heads=12, intermediate_size=3072,
                                      max_position_embeddings=514)
    torch.manual_seed(0)
    transformers.MPNetModel(config, add_pooling_layer=False).eval().save_pretrained(directory)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
               {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]
    (directory / "modules.json").write_text(json.dumps(modules))
    for folder in ("1_Pooling", "2_Normalize"):
        (directory / folder).mkdir()
    (directory / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": 768, "pooling_mode_mean_tokens": True}))
    (directory / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 384}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=None,
                        help="timed batches per side (default: 2; --bias-ab: 20 per step shape)")
    parser.add_argument("--bias-ab", action="store_true",
                        help="bf16: the bias on the attention kernel against SDPA with a mask (see above)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads for --bias-ab")
    parser.add_argument("--model-dir", type=Path, default=None,
                        help="--bias-ab: build the model here (unless there) and keep it")
    args = parser.parse_args(argv)
    if args.bias_ab:
        return bias_ab(args.layers, args.repeats or 20, args.threads, args.model_dir)
    args.repeats = args.repeats or 2
    torch.set_num_threads(1)
    from sentence_transformers import SentenceTransformer

    from embedserve.engine import Batch, Engine
    from embedserve.model.postprocess import postprocess_embeddings
    from embedserve.tokenizer.load import load_tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        build(directory, args.layers)
        st = SentenceTransformer(str(directory), device="cpu")
        tokenizer = load_tokenizer(directory)
        # Words dropped from a text until it fits sentence-transformers' max_seq_length (384),
        # so that neither side truncates.
        texts = []
        for text in mixed_texts(32, np.random.default_rng(0)):
            while len(tokenizer.encode(text)) > 384:
                text = text.rsplit(" ", 8)[0]
            texts.append(text)
        with Engine.load(directory) as engine:
            tokens = sum(len(tokenizer.encode(t)) for t in texts)

            def ours() -> np.ndarray:
                sequences = [tokenizer.encode(t).astype(np.int32) for t in texts]
                return postprocess_embeddings(engine.step(Batch.from_sequences(sequences)).wait(), normalize=True)

            def theirs() -> np.ndarray:
                return st.encode(texts, batch_size=32, convert_to_numpy=True)

            cosine = float((ours() * theirs()).sum(1).min())                        # warm-up, and a check
            engine_s = best_cpu_seconds(ours, args.repeats)
            reference_s = best_cpu_seconds(theirs, args.repeats)
        print(f"MPNet (all-mpnet-base-v2 widths, {args.layers} layers, random weights), 32 mixed texts "
              f"({tokens} tokens), 1 thread, CPU seconds per batch (best of {args.repeats}); "
              f"min cosine vs sentence-transformers {cosine:.6f}")
        print(speedup_table("mixed", tokens, engine_s, reference_s), flush=True)
    return 0


def bias_ab(layers: int, repeats: int, threads: int, model_dir: Path | None) -> int:
    """``--bias-ab``: wall ms per bf16 step, the bias on the kernel against SDPA's mask."""
    from embedserve.engine import Batch, Engine
    from embedserve.engine.modules import bf16_attention
    from embedserve.tokenizer.load import load_tokenizer

    if not bf16_attention.kernel_available():
        print("the native bf16 attention kernel does not run here (not built, or no AVX512-BF16)")
        return 1
    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory() as tmp:
        directory = model_dir or Path(tmp)
        if not (directory / "config.json").exists():
            directory.mkdir(parents=True, exist_ok=True)
            build(directory, layers)
        tokenizer = load_tokenizer(directory)
        rng = np.random.default_rng(0)
        mixed = [tokenizer.encode(t)[:384].astype(np.int32) for t in mixed_texts(32, rng)]
        shapes = {"32 mixed texts": mixed,
                  "1 x 8 tokens": [mixed[0][:8]], "1 x 32 tokens": [mixed[1][:32]]}
        print(f"MPNet (all-mpnet-base-v2 widths, {layers} layers, random weights), bf16, {threads} threads; "
              f"wall ms per step, median of {repeats}, the two taking turns")
        print("| step | SDPA with the bias as mask | bias on the kernel | kernel / SDPA |")
        print("|---|---:|---:|---:|")
        with (Engine.load(directory, dtype="bfloat16") as kernel,
              Engine.load(directory, dtype="bfloat16", small_steps=False) as sdpa):
            sdpa.model.native_attention = False
            for name, sequences in shapes.items():
                batch = Batch.from_sequences(sequences)
                ms = alternating_step_ms({"sdpa": sdpa, "kernel": kernel}, batch, repeats)
                before, after = ms["sdpa"], ms["kernel"]
                print(f"| {name} ({batch.num_tokens} tokens) | {before:.2f} | {after:.2f} | {after / before:.2f}x |")
    return 0
