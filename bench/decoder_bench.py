"""CPU benchmark: tokens/s of the packed engine vs sentence-transformers on a decoder embedder.

The model is a random Qwen3 of about 0.1B parameters shaped like a small
Qwen3-Embedding (hidden 768, 12 layers, 12 query / 4 key-value heads of 64,
SwiGLU intermediate 2048, q/k norms, vocabulary 32,000 tied; 98M parameters),
fp32, written with transformers into a temporary directory together with a
byte-level BPE tokenizer.json (trained here with ``tokenizers``, appending
``<|endoftext|>``) and sentence-transformers metadata (last-token pooling,
Normalize). Speed does not depend on the weights' values, only their shapes.

Texts: batches of 32, each text a window of a seeded synthetic corpus whose
token count (EOS included) is drawn log-uniformly from 16 to 512 (fixed
seed). The engine runs the ids the same tokenizer gives (tokenizing is the
gateway's job); sentence-transformers' ``encode`` gets the texts with the
``batch_size`` that was fastest for it on the warm-up batch (it sorts by
length inside a call, so smaller batches pad less). Calls alternate batch by
batch so other processes' load hits both alike; batch 0 is a warm-up.

    python -m bench decoder [--threads 2] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

BATCH = 32
SHAPE = dict(vocab_size=32000, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
             num_key_value_heads=4, head_dim=64, intermediate_size=2048, max_position_embeddings=1024,
             tie_word_embeddings=True, bos_token_id=0, eos_token_id=0, pad_token_id=0)
EOS = "<|endoftext|>"


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def synthetic_corpus(rng: np.random.Generator, words: int = 60_000) -> str:
    """Seeded pseudo-English: a Zipf-ish vocabulary of invented words with punctuation."""
    letters = np.array(list("etaoinshrdlcumwfgypbvkjxqz"))
    weights = 1.0 / np.arange(1, 27)
    lexicon = ["".join(rng.choice(letters, size=int(rng.integers(1, 10)), p=weights / weights.sum()))
               for _ in range(5000)]
    ranks = 1.0 / np.arange(1, len(lexicon) + 1)
    picks = rng.choice(len(lexicon), size=words, p=ranks / ranks.sum())
    out = []
    for i, pick in enumerate(picks):
        out.append(lexicon[pick] + ("." if i % 13 == 12 else ", " if i % 7 == 6 else ""))
    return " ".join(out)


def write_model(directory: Path, corpus: str) -> None:
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=8000, special_tokens=[EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator([corpus], trainer)
    eos_id = tokenizer.token_to_id(EOS)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"$A:0 {EOS}:0", pair=f"$A:0 {EOS}:0 $B:1 {EOS}:1", special_tokens=[(EOS, eos_id)])
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": EOS, "pad_token": EOS,
        "model_max_length": 1024, "padding_side": "left"}))
    torch.manual_seed(0)
    model = transformers.Qwen3Model(transformers.Qwen3Config(**SHAPE)).eval()
    model.save_pretrained(directory, safe_serialization=True)
    (directory / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]))
    (directory / "1_Pooling").mkdir()
    (directory / "2_Normalize").mkdir()
    (directory / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": SHAPE["hidden_size"], "pooling_mode_lasttoken": True,
        "pooling_mode_mean_tokens": False, "pooling_mode_cls_token": False, "include_prompt": True}))
    (directory / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 1024}))


def make_batches(tokenizer, corpus: str, rng: np.random.Generator, count: int) -> list[list[str]]:
    """``count`` batches of texts whose token counts are log-uniform in [16, 512]."""
    ids = tokenizer.encode(corpus, add_special_tokens=False).ids
    batches = []
    for _ in range(count):
        lengths = np.exp(rng.uniform(np.log(16), np.log(512), BATCH)).astype(int)
        texts = []
        for n in lengths:
            start = int(rng.integers(0, len(ids) - n))
            texts.append(tokenizer.decode(ids[start:start + int(n) - 1]))   # + EOS = n
        batches.append(texts)
    return batches


def seconds_of(call) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3, help="timed batches")
    args = parser.parse_args(argv)
    os.environ["HF_HUB_OFFLINE"] = "1"
    import torch
    from sentence_transformers import SentenceTransformer
    from tokenizers import Tokenizer

    from embedserve.engine import Batch, Engine

    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(prefix="decoder-bench-") as tmp:
        model_dir = Path(tmp)
        log("writing the random Qwen3 and training its tokenizer")
        corpus = synthetic_corpus(rng)
        write_model(model_dir, corpus)
        tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        batches = make_batches(tokenizer, corpus, rng, args.repeats + 1)
        ids = [[np.array(e.ids, np.int32) for e in tokenizer.encode_batch(texts)] for texts in batches]
        tokens = sum(sum(len(s) for s in batch) for batch in ids[1:])

        reference = SentenceTransformer(str(model_dir), device="cpu")
        engine = Engine.load(model_dir)
        params = sum(p.numel() for p in engine.model.parameters())
        log("choosing sentence-transformers' batch_size on the warm-up batch")
        st_times = {size: seconds_of(lambda: reference.encode(batches[0], batch_size=size))
                    for size in (4, 8, 16, 32)}
        best_size = min(st_times, key=st_times.get)
        # Same vectors on both sides, so the speed compares like with like.
        ours = engine.step(Batch.from_sequences(ids[0])).wait()
        ours /= np.linalg.norm(ours, axis=1, keepdims=True)
        theirs = reference.encode(batches[0], batch_size=best_size)
        min_cosine = float((ours * theirs).sum(1).min())

        runs = {f"sentence-transformers encode (batch_size={best_size})":
                lambda i: reference.encode(batches[i], batch_size=best_size),
                "engine fp32 packed (per_sequence)":
                lambda i: engine.step(Batch.from_sequences(ids[i])).wait()}
        totals = {label: 0.0 for label in runs}
        for i in range(1, args.repeats + 1):
            for label, run in runs.items():
                totals[label] += seconds_of(lambda: run(i))
            log(f"batch {i} done")
        engine.close()

    rates = {label: tokens / seconds for label, seconds in totals.items()}
    base = next(iter(rates.values()))
    print(f"Qwen3 {params / 1e6:.0f}M params fp32, threads={args.threads}, {args.repeats} timed batches "
          f"of {BATCH} ({tokens:,} tokens), min cosine engine vs sentence-transformers {min_cosine:.6f}; "
          f"sentence-transformers batch_size tried: "
          + ", ".join(f"{k}: {v:.2f}s" for k, v in st_times.items()))
    print("| tokens/s | mixed 16..512 |")
    print("|---|---|")
    for label, rate in rates.items():
        print(f"| {label} | {rate:,.0f}" + ("" if rate is base else f" ({rate / base:.2f}x)") + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
