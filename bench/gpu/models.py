"""Random-weight models at the shapes of real checkpoints, written where they run.

A lent GPU reaches no model hub and carries at most 64 MiB, so its models are
made on it: transformers builds each family from a config with the real
checkpoint's dimensions (``SHAPES``) and random weights, and saves it with the
sentence-transformers files embedserve reads. Speed depends on shapes, not on
weight values, and parity is checked against transformers on the same weights.

Three scales of each shape: ``real`` (the checkpoint's own dimensions), ``small``
(its head size and attention structure, few layers and a small vocabulary: for
tests/gpu) and ``tiny`` (a few thousand parameters: the CPU dry run).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCALES = ("real", "small", "tiny")


@dataclass(frozen=True)
class Shape:
    """A checkpoint's architecture, transformers config class name, config and pooling."""

    architecture: str
    config_class: str
    config: dict[str, Any]
    pooling: str                              # cls, mean or lasttoken ("score" heads: cls)
    normalize: bool = True
    extra_small: dict[str, Any] = field(default_factory=dict)  # what "small" keeps besides heads
    # The config class's own names for the BERT-style keys ``config`` uses (DistilBERT's
    # dim, n_heads, ...): applied after scaling, so scaling reads one set of names.
    config_names: dict[str, str] = field(default_factory=dict)

    @property
    def task(self) -> str:
        return "score" if self.architecture.endswith("ForSequenceClassification") else "embed"


SHAPES: dict[str, Shape] = {
    # intfloat/multilingual-e5-small (the default model's shape)
    "multilingual-e5-small": Shape("XLMRobertaModel", "XLMRobertaConfig", dict(
        vocab_size=250037, hidden_size=384, num_hidden_layers=12, num_attention_heads=12,
        intermediate_size=1536, max_position_embeddings=514, type_vocab_size=1, pad_token_id=1,
        bos_token_id=0, eos_token_id=2), "mean"),
    # BAAI/bge-base-en-v1.5
    "bge-base": Shape("BertModel", "BertConfig", dict(
        vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
        intermediate_size=3072, max_position_embeddings=512, type_vocab_size=2, pad_token_id=0), "cls"),
    # BAAI/bge-m3 (dense): XLM-R large with 8,192 positions
    "bge-m3": Shape("XLMRobertaModel", "XLMRobertaConfig", dict(
        vocab_size=250002, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
        intermediate_size=4096, max_position_embeddings=8194, type_vocab_size=1, pad_token_id=1,
        bos_token_id=0, eos_token_id=2), "cls"),
    # Qwen/Qwen3-Embedding-0.6B: grouped heads (16 q, 8 kv), head size 128, causal
    "qwen3-embedding-0.6b": Shape("Qwen3Model", "Qwen3Config", dict(
        vocab_size=151669, hidden_size=1024, num_hidden_layers=28, num_attention_heads=16,
        num_key_value_heads=8, head_dim=128, intermediate_size=3072, max_position_embeddings=32768,
        rope_theta=1000000.0, tie_word_embeddings=True, bos_token_id=151643, eos_token_id=151643,
        pad_token_id=151643), "lasttoken"),
    # answerdotai/ModernBERT-base: global every third layer, local window 128
    "modernbert-base": Shape("ModernBertModel", "ModernBertConfig", dict(
        vocab_size=50368, hidden_size=768, num_hidden_layers=22, num_attention_heads=12,
        intermediate_size=1152, max_position_embeddings=8192, global_attn_every_n_layers=3,
        local_attention=128, pad_token_id=50283, bos_token_id=50281, eos_token_id=50282,
        cls_token_id=50281, sep_token_id=50282), "mean"),
    # BAAI/bge-reranker-base: a cross-encoder
    "bge-reranker-base": Shape("XLMRobertaForSequenceClassification", "XLMRobertaConfig", dict(
        vocab_size=250002, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
        intermediate_size=3072, max_position_embeddings=514, type_vocab_size=1, pad_token_id=1,
        bos_token_id=0, eos_token_id=2, num_labels=1), "cls", normalize=False),
    # sentence-transformers/all-mpnet-base-v2: MPNet's relative position bias
    "all-mpnet-base-v2": Shape("MPNetModel", "MPNetConfig", dict(
        vocab_size=30527, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
        intermediate_size=3072, max_position_embeddings=514, relative_attention_num_buckets=32,
        pad_token_id=1, bos_token_id=0, eos_token_id=2), "mean"),
    # mixedbread-ai/mxbai-rerank-base-v1: DeBERTa-v3's disentangled attention, a cross-encoder
    "mxbai-rerank-base": Shape("DebertaV2ForSequenceClassification", "DebertaV2Config", dict(
        vocab_size=128100, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
        intermediate_size=3072, max_position_embeddings=512, relative_attention=True, position_buckets=256,
        max_relative_positions=-1, pos_att_type=["p2c", "c2p"], share_att_key=True, norm_rel_ebd="layer_norm",
        position_biased_input=False, type_vocab_size=0, pad_token_id=0, num_labels=1), "cls", normalize=False),
    # a BERT cross-encoder with segment ids (ms-marco-MiniLM-L-6-v2)
    "ms-marco-minilm": Shape("BertForSequenceClassification", "BertConfig", dict(
        vocab_size=30522, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
        intermediate_size=1536, max_position_embeddings=512, type_vocab_size=2, pad_token_id=0,
        num_labels=1), "cls", normalize=False),
    # sentence-transformers/all-roberta-large-v1
    "all-roberta-large-v1": Shape("RobertaModel", "RobertaConfig", dict(
        vocab_size=50265, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
        intermediate_size=4096, max_position_embeddings=514, type_vocab_size=1, pad_token_id=1,
        bos_token_id=0, eos_token_id=2), "mean"),
    # sentence-transformers/msmarco-distilbert-base-v4
    "msmarco-distilbert-base-v4": Shape("DistilBertModel", "DistilBertConfig", dict(
        vocab_size=30522, hidden_size=768, num_hidden_layers=6, num_attention_heads=12,
        intermediate_size=3072, max_position_embeddings=512, pad_token_id=0), "mean",
        config_names=dict(hidden_size="dim", num_hidden_layers="n_layers", num_attention_heads="n_heads",
                          intermediate_size="hidden_dim")),
    # nomic-ai/nomic-embed-text-v1.5: rotary positions, SwiGLU
    "nomic-embed-text-v1.5": Shape("NomicBertModel", "NomicBertConfig", dict(
        vocab_size=30528, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
        intermediate_size=3072, max_position_embeddings=8192, pad_token_id=0,
        rope_parameters={"rope_type": "default", "rope_theta": 1000.0}), "mean"),
    # google/embeddinggemma-300m: Gemma3 used bidirectionally, grouped heads (3 q, 1 kv) of
    # 256, sliding layers (window 512) with one global layer in six (its Dense modules not
    # written: they run after pooling, on the CPU path's code)
    "embeddinggemma-300m": Shape("Gemma3TextModel", "Gemma3TextConfig", dict(
        vocab_size=262144, hidden_size=768, num_hidden_layers=24, num_attention_heads=3,
        num_key_value_heads=1, head_dim=256, intermediate_size=1152, max_position_embeddings=2048,
        sliding_window=512, query_pre_attn_scalar=256, use_bidirectional_attention=True,
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}},
        pad_token_id=0, eos_token_id=1, bos_token_id=2), "mean"),
    # intfloat/e5-mistral-7b-instruct's structure (sliding window 4096) at a small width
    "mistral-window": Shape("MistralModel", "MistralConfig", dict(
        vocab_size=32000, hidden_size=1024, num_hidden_layers=4, num_attention_heads=8,
        num_key_value_heads=2, intermediate_size=2048, max_position_embeddings=4096,
        sliding_window=64, bos_token_id=1, eos_token_id=2), "lasttoken"),
}

# Keys that size a model; "small" and "tiny" replace them, keeping the rest (head size,
# grouping, windows, positions) as the checkpoint has them.
_TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
             vocab_size=512)


def scaled_config(shape: Shape, scale: str) -> dict[str, Any]:
    """The transformers config fields of ``shape`` at ``scale``."""
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
    config = dict(shape.config)
    if scale == "real":
        return config
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads", heads)
    head_dim = config.get("head_dim", config["hidden_size"] // heads)
    if scale == "small":
        # 4 query heads at the real head size, the real grouping, two or three layers.
        groups = heads // kv_heads
        small_heads = max(4, groups)
        config.update(num_attention_heads=small_heads, hidden_size=small_heads * head_dim,
                      intermediate_size=2 * small_heads * head_dim, vocab_size=4096,
                      num_hidden_layers=3 if "global_attn_every_n_layers" in config else 2)
        if "num_key_value_heads" in config:
            config["num_key_value_heads"] = small_heads // groups
        if "head_dim" in config:
            config["head_dim"] = head_dim
    else:
        config.update(_TINY)
        if "num_key_value_heads" in config:
            config["num_key_value_heads"] = 1 if kv_heads < heads else 2
        if "head_dim" in config:
            config["head_dim"] = 16
        if "global_attn_every_n_layers" in config:
            config["num_hidden_layers"] = 3
    for key in ("pad_token_id", "bos_token_id", "eos_token_id", "cls_token_id", "sep_token_id"):
        if key in config and config[key] >= config["vocab_size"]:
            config[key] = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
                           "cls_token_id": 1, "sep_token_id": 2}[key]
    return config


def write_model(directory: Path, name: str, scale: str = "real", seed: int = 0,
                device: str = "cpu") -> Path:
    """Save a random ``SHAPES[name]`` at ``scale`` into ``directory`` (built on ``device``:
    a real-scale model initializes in seconds on a GPU, minutes on a CPU)."""
    import torch
    import transformers

    shape = SHAPES[name]
    fields = {shape.config_names.get(key, key): value for key, value in scaled_config(shape, scale).items()}
    config = getattr(transformers, shape.config_class)(**fields)
    torch.manual_seed(seed)
    with torch.device(device):
        model = getattr(transformers, shape.architecture)(config).eval()
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory, safe_serialization=True)
    write_tokenizer(directory)
    if shape.task == "embed":
        write_pooling(directory, config.hidden_size, shape.pooling, shape.normalize)
    return directory


_CORPUS = ["The quick brown fox jumps over the lazy dog.", "How do I bake bread at home?",
           "Sentence embeddings map text to vectors; cosine similarity compares them.",
           "A packed batch holds many sequences of different lengths without padding.",
           "Numbers like 12345 and symbols #@% appear too."]
_SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]


def write_tokenizer(directory: Path) -> None:
    """A byte-level BPE of a few hundred pieces trained here (``<s> $A </s>``): the
    references need a tokenizer to load, and ``embedserve serve`` one to serve text; it
    runs on the ``tokenizers`` library, so no native kernel compiles on the device.
    Its ids (< 300) fit every shape's vocabulary."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=_SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(_CORPUS * 4, trainer)
    bos, eos = tokenizer.token_to_id("<s>"), tokenizer.token_to_id("</s>")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s>:0 $A:0 </s>:0", pair="<s>:0 $A:0 </s>:0 $B:1 </s>:1",
        special_tokens=[("<s>", bos), ("</s>", eos)])
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "cls_token": "<s>", "sep_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>",
        "model_max_length": 8192}))


def write_pooling(directory: Path, dimension: int, pooling: str, normalize: bool) -> None:
    """sentence-transformers' modules.json and 1_Pooling: what embedserve and
    sentence-transformers both read for pooling and normalization."""
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize",
                        "type": "sentence_transformers.models.Normalize"})
        (directory / "2_Normalize").mkdir(exist_ok=True)
    (directory / "modules.json").write_text(json.dumps(modules, indent=2))
    (directory / "1_Pooling").mkdir(exist_ok=True)
    (directory / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": dimension, "pooling_mode_cls_token": pooling == "cls",
        "pooling_mode_mean_tokens": pooling == "mean", "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False, "pooling_mode_weightedmean_tokens": False,
        "pooling_mode_lasttoken": pooling == "lasttoken", "include_prompt": True}))
