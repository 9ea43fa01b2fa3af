"""Tiny random checkpoints of the families of issue 42, written by the tests.

One directory per family as the hub ships one: ``config.json`` + safetensors
from transformers' own model class (``save_pretrained``), a ``tokenizer.json`` of
the family's kind trained here by ``tokenizers`` on a few sentences, and
sentence-transformers metadata. The tokenizer kinds follow the real models:

- MPNet, DistilBERT, NomicBERT: WordPiece (MPNet's specials <s> <pad>=1 </s>);
- RoBERTa: byte-level BPE, <pad>=1;
- DeBERTa-v3: Unigram with a Metaspace pre-tokenizer;
- Gemma3: BPE with byte fallback, <bos> $A <eos> (EmbeddingGemma's template).

Sizes are tiny (hidden 64, 3-4 layers, vocabulary 320) and relative-position
ranges short (MPNet buckets go logarithmic past 8 tokens, DeBERTa's past 8 with
16 buckets, Gemma3's sliding window is 8), so sequences of up to 100 tokens
reach every branch. Norm weights are drawn away from 1 so a misplaced norm shows.
"""

from __future__ import annotations

import json
from pathlib import Path

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Relative positions, rotary angles and sliding windows all shape attention.",
    "Sentence embeddings map text to vectors; cosine similarity compares them.",
    "A packed batch holds many sequences of different lengths without padding.",
    "Where is the Eiffel tower? It stands in Paris, the capital of France.",
    "Hello world! Numbers like 12345 and symbols #@% appear too.",
]
VOCAB_SIZE = 320
HIDDEN = 64
FAMILIES = ("mpnet", "distilbert", "roberta", "deberta-v2", "nomic-bert", "gemma3")
QUERY_PROMPT = "task: search result | query: "

# family -> (tokenizer kind, specials in id order, first, last)
_TOKENIZERS = {
    "mpnet": ("wordpiece", ["<s>", "<pad>", "</s>", "[UNK]", "<mask>"], "<s>", "</s>"),
    "distilbert": ("wordpiece", ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], "[CLS]", "[SEP]"),
    "nomic-bert": ("wordpiece", ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], "[CLS]", "[SEP]"),
    "roberta": ("bytelevel", ["<s>", "<pad>", "</s>", "<unk>", "<mask>"], "<s>", "</s>"),
    "deberta-v2": ("unigram", ["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"], "[CLS]", "[SEP]"),
    "gemma3": ("bpe_byte_fallback", ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"], "<bos>", "<eos>"),
}


def build_tokenizer(directory: Path, family: str) -> None:
    """Write tokenizer.json + tokenizer_config.json of the family's kind."""
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )

    kind, specials, first, last = _TOKENIZERS[family]
    unk = specials[3] if kind != "wordpiece" else "[UNK]"
    if kind == "wordpiece":
        tokenizer = Tokenizer(models.WordPiece(unk_token=unk))
        tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
        tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tokenizer.decoder = decoders.WordPiece()
        trainer = trainers.WordPieceTrainer(vocab_size=VOCAB_SIZE, special_tokens=specials)
    elif kind == "bytelevel":
        tokenizer = Tokenizer(models.BPE(unk_token=unk))
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=specials,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    elif kind == "unigram":
        tokenizer = Tokenizer(models.Unigram())
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
        tokenizer.decoder = decoders.Metaspace()
        trainer = trainers.UnigramTrainer(vocab_size=200, special_tokens=specials, unk_token=unk)
    else:
        tokenizer = Tokenizer(models.BPE(unk_token=unk, byte_fallback=True))
        tokenizer.normalizer = normalizers.Replace(" ", "▁")
        tokenizer.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback()])
        trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=specials)
    tokenizer.train_from_iterator(CORPUS * 4, trainer)
    first_id, last_id = tokenizer.token_to_id(first), tokenizer.token_to_id(last)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{first}:0 $A:0 {last}:0", pair=f"{first}:0 $A:0 {last}:0 $B:1 {last}:1",
        special_tokens=[(first, first_id), (last, last_id)])
    tokenizer.save(str(directory / "tokenizer.json"))
    pad = specials[0] if specials[0] in ("[PAD]", "<pad>") else specials[1]
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": first, "eos_token": last,
        "cls_token": first, "sep_token": last, "pad_token": pad, "unk_token": unk,
        "mask_token": specials[4], "model_max_length": 128}))


def _config(family: str, **overrides):
    import transformers

    common = dict(vocab_size=VOCAB_SIZE, initializer_range=0.2)
    bert_sizes = dict(hidden_size=HIDDEN, num_hidden_layers=3, num_attention_heads=4, intermediate_size=96,
                      max_position_embeddings=130)
    if family == "mpnet":
        config = transformers.MPNetConfig(**common, **bert_sizes)
    elif family == "roberta":
        config = transformers.RobertaConfig(**common, **bert_sizes)
    elif family == "distilbert":
        config = transformers.DistilBertConfig(**common, dim=HIDDEN, n_layers=3, n_heads=4, hidden_dim=96,
                                               max_position_embeddings=128)
    elif family == "deberta-v2":
        # deberta-v3's shape: relative attention only, log buckets, no segments.
        config = transformers.DebertaV2Config(
            **common, **bert_sizes, relative_attention=True, position_buckets=16, max_relative_positions=64,
            pos_att_type=["p2c", "c2p"], share_att_key=True, norm_rel_ebd="layer_norm",
            position_biased_input=False, type_vocab_size=0)
    elif family == "nomic-bert":
        config = transformers.NomicBertConfig(**common, **bert_sizes,
                                              rope_parameters={"rope_type": "default", "rope_theta": 100.0})
    elif family == "gemma3":
        config = transformers.Gemma3TextConfig(
            **common, hidden_size=HIDDEN, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
            head_dim=32, intermediate_size=96, max_position_embeddings=128, sliding_window=8,
            layer_types=["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"],
            query_pre_attn_scalar=24, use_bidirectional_attention=True,
            rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                             "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}},
            pad_token_id=0, eos_token_id=1, bos_token_id=2)
    else:
        raise ValueError(family)
    for key, value in overrides.items():
        setattr(config, key, value)
    return config


def model_class(family: str, reranker: bool = False):
    import transformers

    if reranker:
        return transformers.DebertaV2ForSequenceClassification
    return {"mpnet": transformers.MPNetModel, "roberta": transformers.RobertaModel,
            "distilbert": transformers.DistilBertModel, "deberta-v2": transformers.DebertaV2Model,
            "nomic-bert": transformers.NomicBertModel, "gemma3": transformers.Gemma3TextModel}[family]


def build_family_dir(directory: Path, family: str, pooling: str = "mean", normalize: bool = True,
                     reranker: bool = False, seed: int = 0, **overrides) -> Path:
    """Save a random ``family`` model with its kind of tokenizer and ST metadata into ``directory``.

    ``reranker`` (DeBERTa-v2 only): a one-label DebertaV2ForSequenceClassification,
    as mxbai-rerank-base-v1 is, with no sentence-transformers files.
    """
    import torch

    from st_metadata import write_st_metadata

    directory.mkdir(parents=True, exist_ok=True)
    build_tokenizer(directory, family)
    torch.manual_seed(seed)
    config = _config(family, **overrides)
    if reranker:
        config.num_labels = 1
    cls = model_class(family, reranker)
    model = cls(config, add_pooling_layer=False) if family == "mpnet" else cls(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name.lower():
                # Gemma's norms scale by 1 + weight; the others by weight.
                param.uniform_(-0.5, 0.5) if family == "gemma3" else param.uniform_(0.5, 1.5)
            elif "relative_attention_bias" in name:
                param.normal_(0.0, 1.0)           # MPNet's bias: big enough to matter
    model.eval().save_pretrained(directory, safe_serialization=True)
    if not reranker:
        write_st_metadata(directory, HIDDEN, pooling, normalize, max_seq_length=128)
    return directory


def build_embeddinggemma_dir(directory: Path, seed: int = 0) -> Path:
    """Gemma3 as EmbeddingGemma ships: Transformer, mean Pooling, two Dense modules
    (no activation, then Tanh with a bias, to cover both), Normalize, and prompts;
    saved by sentence-transformers itself."""
    import torch
    from sentence_transformers import SentenceTransformer, models

    raw = build_family_dir(directory.parent / (directory.name + "_raw"), "gemma3", seed=seed)
    torch.manual_seed(seed + 1)
    modules = [models.Transformer(str(raw), max_seq_length=128), models.Pooling(HIDDEN, "mean"),
               models.Dense(HIDDEN, 2 * HIDDEN, bias=False, activation_function=torch.nn.Identity()),
               models.Dense(2 * HIDDEN, 48, bias=True, activation_function=torch.nn.Tanh()),
               models.Normalize()]
    st = SentenceTransformer(modules=modules, device="cpu",
                             prompts={"query": QUERY_PROMPT, "document": "title: none | text: "})
    st.save(str(directory))
    return directory
