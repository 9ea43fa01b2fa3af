"""Tiny random ModernBERT checkpoints with a BPE tokenizer, written by the tests.

A ModernBERT directory as the hub ships one: ``config.json`` + safetensors
from transformers' ``ModernBertModel``, a byte-level BPE ``tokenizer.json``
([CLS] $A [SEP], like ModernBERT's) trained here on a few sentences with
``tokenizers``, and sentence-transformers metadata (Transformer + Pooling
(+ Normalize)). Small enough to build in a second; the local window (8) is
far shorter than the longest test sequences (40), so windows matter.
"""

from __future__ import annotations

import json
from pathlib import Path

from st_metadata import write_st_metadata

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "ModernBERT alternates global and local attention with rotary positions.",
    "Sentence embeddings map text to vectors; cosine similarity compares them.",
    "A packed batch holds many sequences of different lengths without padding.",
    "Hello world! Numbers like 12345 and symbols #@% appear too.",
]
SPECIALS = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]
VOCAB_SIZE = 320
HIDDEN = 64


def build_bpe_tokenizer(directory: Path) -> int:
    """Write tokenizer.json + tokenizer_config.json; returns the vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(CORPUS * 4, trainer)
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0", pair="[CLS]:0 $A:0 [SEP]:0 $B:0 [SEP]:0",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "cls_token": "[CLS]", "sep_token": "[SEP]",
        "pad_token": "[PAD]", "unk_token": "[UNK]", "mask_token": "[MASK]",
        "model_max_length": 128, "model_input_names": ["input_ids", "attention_mask"]}))
    return tokenizer.get_vocab_size()


def modernbert_config(global_every: int = 3, local_attention: int = 8, **overrides):
    import transformers

    sizes = dict(vocab_size=VOCAB_SIZE, hidden_size=HIDDEN, num_hidden_layers=4,
                 num_attention_heads=4, intermediate_size=96, max_position_embeddings=128,
                 global_attn_every_n_layers=global_every, local_attention=local_attention,
                 global_rope_theta=160_000.0, local_rope_theta=10_000.0,
                 pad_token_id=3, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2,
                 # spread the attention well away from uniform, so windows and positions matter
                 initializer_range=0.2)
    sizes.update(overrides)
    return transformers.ModernBertConfig(**sizes)


def build_tiny_modernbert(directory: Path, pooling: str = "mean", normalize: bool = True,
                          global_every: int = 3, seed: int = 0,
                          xlmr_tokenizer_dir: Path | None = None, hidden: int = HIDDEN) -> Path:
    """Save a random ModernBertModel with a BPE tokenizer and ST metadata into ``directory``.

    With ``xlmr_tokenizer_dir``, XLM-R's SentencePiece tokenizer files are copied
    instead (and the vocabulary is XLM-R's 250,002): a tokenizer every checkout loads.
    """
    import shutil

    import torch
    import transformers

    directory.mkdir(parents=True, exist_ok=True)
    overrides = {"hidden_size": hidden}
    if xlmr_tokenizer_dir is None:
        build_bpe_tokenizer(directory)
    else:
        for name in ("tokenizer.json", "sentencepiece.bpe.model"):
            shutil.copy(xlmr_tokenizer_dir / name, directory / name)
        (directory / "tokenizer_config.json").write_text(json.dumps({
            "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
            "cls_token": "<s>", "sep_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>",
            "mask_token": "<mask>", "model_max_length": 128}))
        overrides |= dict(vocab_size=250_002, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                         cls_token_id=0, sep_token_id=2)
    torch.manual_seed(seed)
    model = transformers.ModernBertModel(modernbert_config(global_every, **overrides)).eval()
    with torch.no_grad():
        # Non-trivial norm weights, so a missing or misplaced norm shows.
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
    model.save_pretrained(directory, safe_serialization=True)
    write_st_metadata(directory, hidden, pooling, normalize, max_seq_length=128)
    return directory
