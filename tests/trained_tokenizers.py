"""tokenizer.json files trained here by ``tokenizers`` on python_docs_text(), shaped like the
tokenizers models ship with (GPT-2, Qwen3-Embedding, a byte-fallback Unigram, a
lowercasing Metaspace BPE), for the tests of the tokenizers backend and the gateway."""

from __future__ import annotations

import json
from pathlib import Path

import tokenizers
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers

from conftest import python_docs_text

QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")
MULTILINGUAL = [
    "Hello, world!", "  leading and trailing spaces  ", "tabs\tand\nnewlines\r\n", "",
    "Ünïcödé façade — naïve café", "ＦＵＬＬＷＩＤＴＨ ｔｅｘｔ １２３", "Straße ǅ ﬁ ligature",
    "日本語のテキストです。", "中文文本，包括标点。", "한국어 텍스트", "Русский текст, ёлки",
    "العربية نص", "עברית", "हिन्दी पाठ", "ไทยข้อความ", "emoji 👍🏽 👨‍👩‍👧 🇫🇷 ✨",
    "e\u0301 combining a\u0308", "x" * 300, "def f(x):\n    return x ** 2  # comment",
    "<|endoftext|> looks special but is text", "[CLS] [SEP] <s> </s>", "\u200b\ufeffzero width",
]


def docs_lines(limit: int | None = None) -> list[str]:
    found = [line for line in python_docs_text().split("\n") if line.strip()]
    return found[:limit] if limit else found


def save(tokenizer: tokenizers.Tokenizer, path: Path) -> Path:
    tokenizer.save(str(path))
    return path


def gpt2_bpe(path: Path) -> Path:
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    tok.train_from_iterator(docs_lines(), trainers.BpeTrainer(
        vocab_size=3000, special_tokens=["<|endoftext|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return save(tok, path)


def qwen3_bpe(path: Path) -> Path:
    tok = tokenizers.Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(tokenizers.Regex(QWEN_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(docs_lines(), trainers.BpeTrainer(
        vocab_size=3000, special_tokens=["<|endoftext|>", "<|im_start|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    eos = tok.token_to_id("<|endoftext|>")
    tok.post_processor = processors.TemplateProcessing(
        single="$A <|endoftext|>", pair="$A <|endoftext|> $B:1 <|endoftext|>:1",
        special_tokens=[("<|endoftext|>", eos)])
    return save(tok, path)


def unigram_byte_fallback(path: Path) -> Path:
    tok = tokenizers.Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(docs_lines(), trainers.UnigramTrainer(
        vocab_size=1500, special_tokens=["<unk>", "<s>", "</s>"], unk_token="<unk>", show_progress=False))
    doc = json.loads(tok.to_str())
    known = {piece for piece, _ in doc["model"]["vocab"]}
    doc["model"]["vocab"] += [[f"<0x{b:02X}>", 0.0] for b in range(256) if f"<0x{b:02X}>" not in known]
    doc["model"]["byte_fallback"] = True
    path.write_text(json.dumps(doc, ensure_ascii=False))
    tok = tokenizers.Tokenizer.from_file(str(path))
    bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", bos), ("</s>", eos)])
    return save(tok, path)


def lowercase_metaspace_bpe(path: Path) -> Path:
    tok = tokenizers.Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(docs_lines(), trainers.BpeTrainer(
        vocab_size=2000, special_tokens=["[UNK]", "[CLS]", "[SEP]", "[PAD]"], show_progress=False))
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    return save(tok, path)


def unigram_metaspace(path: Path, lowercase: bool) -> Path:
    tok = tokenizers.Tokenizer(models.Unigram())
    if lowercase:
        tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.train_from_iterator(docs_lines(2000), trainers.UnigramTrainer(
        vocab_size=800, special_tokens=["<unk>", "<s>", "</s>"], unk_token="<unk>", show_progress=False))
    bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", bos), ("</s>", eos)])
    return save(tok, path)
