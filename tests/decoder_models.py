"""Tiny random decoder embedders (Qwen3, Qwen2, Llama, Mistral) written with transformers.

Shared by the decoder parity, sentence-transformers and end-to-end tests: each
variant mirrors a real checkpoint's shape choices (grouped-query attention,
Qwen3's explicit head_dim != hidden / heads, Qwen2's q/k/v biases, tied or
untied embeddings, bare ``*Model`` vs ``*ForCausalLM`` weight names) at toy
sizes. Optionally the Qwen3-Embedding-shaped byte-level BPE tokenizer.json of
trained_tokenizers.py, whose post-processor appends ``<|endoftext|>``.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import transformers

from st_metadata import write_st_metadata

VOCAB_SIZE = 3072                  # covers trained_tokenizers.qwen3_bpe's 3,000 ids
HIDDEN = 64
EOS = "<|endoftext|>"
QUERY_PROMPT = "Instruct: Given a web search query, retrieve relevant passages\nQuery:"

_COMMON = dict(vocab_size=VOCAB_SIZE, hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=4,
               intermediate_size=96, max_position_embeddings=512, initializer_range=0.1,
               bos_token_id=0, eos_token_id=0, pad_token_id=0)

# variant -> (architecture saved in config.json, config class, extra config fields)
VARIANTS: dict[str, tuple[str, type, dict]] = {
    # Qwen3-Embedding: q/k norms, head_dim 24 (4 heads x 24 != hidden 64), GQA, tied embeddings,
    # saved bare as sentence-transformers saves its Qwen3Model.
    "qwen3": ("Qwen3Model", transformers.Qwen3Config,
              dict(num_key_value_heads=2, head_dim=24, tie_word_embeddings=True)),
    # Qwen3-Embedding's hub config says Qwen3ForCausalLM; weights under "model."
    "qwen3_causal_lm": ("Qwen3ForCausalLM", transformers.Qwen3Config,
                        dict(num_key_value_heads=2, head_dim=24, tie_word_embeddings=True)),
    # gte-Qwen2: q/k/v biases, 2 kv heads, untied LM head present in the file.
    "qwen2": ("Qwen2ForCausalLM", transformers.Qwen2Config,
              dict(num_key_value_heads=2, tie_word_embeddings=False)),
    # Llama with every optional bias on and one kv head (multi-query attention).
    "llama": ("LlamaModel", transformers.LlamaConfig,
              dict(num_key_value_heads=1, attention_bias=True, mlp_bias=True, rope_theta=500000.0)),
    # e5-mistral's shape with a sliding window short enough for the test lengths to hit it.
    "mistral": ("MistralModel", transformers.MistralConfig,
                dict(num_key_value_heads=2, sliding_window=16)),
}


def write_tokenizer(directory: Path) -> None:
    """Qwen3-Embedding's tokenizer shape (trained_tokenizers.qwen3_bpe: byte-level BPE whose
    post-processor appends EOS) plus the tokenizer_config.json transformers reads."""
    from trained_tokenizers import qwen3_bpe

    qwen3_bpe(directory / "tokenizer.json")
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": EOS, "pad_token": EOS,
        "model_max_length": 512, "padding_side": "left"}))


def build_decoder_dir(directory: Path, variant: str, pooling: str = "lasttoken", normalize: bool = True,
                      causal: bool = True, tokenizer: bool = False, seed: int = 0) -> Path:
    """Save a random tiny decoder ``variant`` with sentence-transformers metadata into ``directory``.

    ``causal=False`` writes ``"is_causal": false`` into config.json (a decoder
    fine-tuned as a bidirectional encoder).
    """
    architecture, config_class, extra = VARIANTS[variant]
    config = config_class(**_COMMON, **extra)
    if not causal:
        config.is_causal = False
    torch.manual_seed(seed)
    model = getattr(transformers, architecture)(config).eval()
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory, safe_serialization=True)
    write_st_metadata(directory, HIDDEN, pooling, normalize, {"query": QUERY_PROMPT, "document": ""},
                      max_seq_length=512)
    if tokenizer:
        write_tokenizer(directory)
    return directory


def hf_reference_model(model_dir: Path) -> torch.nn.Module:
    """The transformers base model (no LM head) of ``model_dir``, eager attention, eval mode."""
    model = transformers.AutoModel.from_pretrained(model_dir, attn_implementation="eager")
    return model.eval()
