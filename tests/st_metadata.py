"""The sentence-transformers files of a model directory that tests write beside a checkpoint.

modules.json (Transformer, Pooling, optionally Normalize), 1_Pooling/config.json (cls, mean
or lasttoken), sentence_bert_config.json and, with prompts, config_sentence_transformers.json:
what sentence-transformers loads as the reference and what model/config.py reads.
"""

from __future__ import annotations

import json
from pathlib import Path


def write_st_metadata(directory: Path, dimension: int, pooling: str, normalize: bool,
                      prompts: dict[str, str] | None = None, max_seq_length: int | None = None) -> None:
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
    if max_seq_length is not None:
        (directory / "sentence_bert_config.json").write_text(json.dumps(
            {"max_seq_length": max_seq_length, "do_lower_case": False}))
    if prompts is not None:
        (directory / "config_sentence_transformers.json").write_text(json.dumps(
            {"prompts": prompts, "default_prompt_name": None, "similarity_fn_name": "cosine"}))
