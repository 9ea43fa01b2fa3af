"""Tiny random LLM rerankers written by the tests, and the model card's reference scores.

``build_llm_reranker`` saves a Qwen3-Reranker-shaped folder: a random
``Qwen3ForCausalLM`` (tied embeddings, as Qwen3-Reranker-0.6B) with no
sentence-transformers files, or a converted ``Qwen3ForSequenceClassification``
(one label); either with a byte-level BPE tokenizer trained here whose specials
are Qwen's chat markers and whose vocabulary has "yes" and "no" as single tokens.
``model_card_scores`` is the Qwen3-Reranker model card's computation with
transformers: prefix ids + formatted pair ids + suffix ids, the last token's
logits, softmax over (no, yes), yes's probability; for the converted model, the
sigmoid of its one logit.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import transformers

from trained_tokenizers import QWEN_SPLIT, docs_lines

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
PREFIX = ('<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and '
          'the Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n')
SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"


def write_tokenizer(directory: Path) -> None:
    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(tokenizers.Regex(QWEN_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    lines = docs_lines(3000) + ["yes no yes no", "yes", "no"] * 200
    tok.train_from_iterator(lines, trainers.BpeTrainer(
        vocab_size=2000, special_tokens=SPECIALS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    assert tok.token_to_id("yes") is not None and tok.token_to_id("no") is not None
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
        "model_max_length": 512, "padding_side": "left"}))


def build_llm_reranker(directory: Path, architecture: str = "Qwen3ForCausalLM", seed: int = 0) -> Path:
    config = transformers.Qwen3Config(
        vocab_size=2048, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=24, intermediate_size=96, max_position_embeddings=512, initializer_range=0.1,
        tie_word_embeddings=True, num_labels=1, pad_token_id=0, bos_token_id=0, eos_token_id=2)
    torch.manual_seed(seed)
    model = getattr(transformers, architecture)(config).eval()
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory, safe_serialization=True)
    write_tokenizer(directory)
    return directory


def model_card_scores(directory: Path, query: str, documents: list[str],
                      instruction: str = INSTRUCTION) -> list[float]:
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    prefix = tokenizer.encode(PREFIX, add_special_tokens=False)
    suffix = tokenizer.encode(SUFFIX, add_special_tokens=False)
    texts = [f"<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {doc}" for doc in documents]
    causal = "ForCausalLM" in json.loads((directory / "config.json").read_text())["architectures"][0]
    model = (transformers.AutoModelForCausalLM if causal
             else transformers.AutoModelForSequenceClassification).from_pretrained(directory).eval()
    yes, no = tokenizer.convert_tokens_to_ids("yes"), tokenizer.convert_tokens_to_ids("no")
    scores = []
    with torch.no_grad():
        for text in texts:
            ids = torch.tensor([prefix + tokenizer(text, add_special_tokens=False)["input_ids"] + suffix])
            logits = model(input_ids=ids).logits
            if causal:
                last = logits[0, -1]
                scores.append(torch.log_softmax(torch.stack([last[no], last[yes]]), dim=0)[1].exp().item())
            else:
                scores.append(torch.sigmoid(logits[0, 0]).item())
    return scores
