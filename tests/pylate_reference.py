"""PyLate 1.6.0's ColBERT encoding, on transformers: the reference for PyLate and
Stanford-NLP ColBERT folders.

PyLate (``pylate.models.ColBERT``) pins sentence-transformers 5.3 and does not run over
sentence-transformers 6 (its loading hooks and ``Transformer.tokenize`` padding are gone
there), so this is its algorithm, step for step from pylate/models/colbert.py and
pylate/models/Dense.py of 1.6.0, over the folder's transformers encoder (``AutoModel``:
BERT, ModernBERT) and its projection. Loading (``__init__``, ``_load_sbert_model``, the Stanford branch): the
settings from config_sentence_transformers.json (or artifact.metadata), defaults
``[Q] `` / ``[D] ``, 32 / 180, expansion on, not attended, punctuation skiplist; each
prefix ``convert_tokens_to_ids``; the tokenizer's pad token set to its mask token.
``tokenize``: the tokenizer capped at length - 1 (the marker's place), padded to that cap
for queries when expanding, the marker inserted after the first token (mask 1, segment 0),
the whole mask set to 1 when the expansion is attended. ``encode``: the encoder, the
Dense projections on every token, queries keep every position (expansion on) or their
attended ones, documents their attended non-skiplist ones, each vector L2-normalized.
``scores``: pylate.scores.colbert_scores (MaxSim summed over query tokens).
"""

from __future__ import annotations

import json
import string
from pathlib import Path

import numpy as np
import torch


class PyLateReference:
    def __init__(self, folder: Path) -> None:
        import transformers
        from safetensors.torch import load_file

        self.tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
        self.encoder = transformers.AutoModel.from_pretrained(folder).eval()
        config = json.loads((folder / "config.json").read_text())
        self.linears: list[torch.nn.Linear] = []
        if config["architectures"][0] == "HF_ColBERT":
            metadata_path = folder / "artifact.metadata"
            metadata = json.loads(metadata_path.read_text()) if metadata_path.exists() else {}
            settings = {"query_prefix": metadata.get("query_token_id") or "[unused0]",
                        "document_prefix": metadata.get("doc_token_id") or "[unused1]",
                        "query_length": metadata.get("query_maxlen"), "document_length": metadata.get("doc_maxlen"),
                        "attend_to_expansion_tokens": metadata.get("attend_to_mask_tokens")}
            # Dense.from_stanford_weights: model.safetensors, else pytorch_model.bin
            weight = (load_file(str(folder / "model.safetensors")) if (folder / "model.safetensors").exists()
                      else torch.load(str(folder / "pytorch_model.bin"), weights_only=True))["linear.weight"]
            linear = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
            linear.weight.data = weight
            self.linears.append(linear)
        else:
            saved = json.loads((folder / "config_sentence_transformers.json").read_text())
            settings = {key: saved.get(key) for key in ("query_prefix", "document_prefix", "query_length",
                                                        "document_length", "attend_to_expansion_tokens",
                                                        "skiplist_words", "do_query_expansion")}
            for module in json.loads((folder / "modules.json").read_text())[1:]:
                dense = folder / module["path"]
                dense_config = json.loads((dense / "config.json").read_text())
                state = load_file(str(dense / "model.safetensors"))
                linear = torch.nn.Linear(dense_config["in_features"], dense_config["out_features"],
                                         bias=dense_config["bias"])
                linear.load_state_dict({name.removeprefix("linear."): t for name, t in state.items()})
                self.linears.append(linear)

        def setting(key, default):
            return settings.get(key) if settings.get(key) is not None else default

        self.query_prefix = setting("query_prefix", "[Q] ")
        self.document_prefix = setting("document_prefix", "[D] ")
        self.query_length = setting("query_length", 32)
        self.document_length = setting("document_length", 180)
        self.do_query_expansion = setting("do_query_expansion", True)
        self.attend = setting("attend_to_expansion_tokens", False) and self.do_query_expansion
        words = setting("skiplist_words", list(string.punctuation))
        self.skiplist = [self.tokenizer.convert_tokens_to_ids(word) for word in words]
        self.prefix_ids = {True: self.tokenizer.convert_tokens_to_ids(self.query_prefix) if self.query_prefix else None,
                           False: self.tokenizer.convert_tokens_to_ids(self.document_prefix)
                           if self.document_prefix else None}
        self.tokenizer.pad_token = self.tokenizer.mask_token

    def tokenize(self, texts: list[str], is_query: bool) -> dict[str, torch.Tensor]:
        max_length = self.query_length if is_query else self.document_length
        prefix_id = self.prefix_ids[is_query]
        pad_to_cap = is_query and self.do_query_expansion
        features = dict(self.tokenizer(texts, padding="max_length" if pad_to_cap else True, truncation="longest_first",
                                       return_tensors="pt",
                                       max_length=max_length - 1 if prefix_id is not None else max_length))

        def insert(tensor: torch.Tensor, value: int) -> torch.Tensor:     # ColBERT.insert_prefix_token
            column = torch.full((tensor.shape[0], 1), value, dtype=tensor.dtype)
            return torch.cat([tensor[:, :1], column, tensor[:, 1:]], dim=1)

        if prefix_id is not None:
            features["input_ids"] = insert(features["input_ids"], prefix_id)
            features["attention_mask"] = insert(features["attention_mask"], 1)
            if "token_type_ids" in features:
                features["token_type_ids"] = insert(features["token_type_ids"], 0)
        if is_query and self.attend:
            features["attention_mask"].fill_(1)
        return features

    def encode(self, texts: list[str], is_query: bool) -> list[np.ndarray]:
        features = self.tokenize(texts, is_query)
        with torch.no_grad():
            tokens = self.encoder(**features).last_hidden_state
            for linear in self.linears:
                tokens = linear(tokens)
        if not is_query:
            keep = ~torch.isin(features["input_ids"], torch.tensor(self.skiplist)) & features["attention_mask"].bool()
        elif self.do_query_expansion:
            keep = torch.ones_like(features["input_ids"], dtype=torch.bool)
        else:
            keep = features["attention_mask"].bool()
        return [torch.nn.functional.normalize(t[k], p=2, dim=1).numpy() for t, k in zip(tokens, keep, strict=True)]


def colbert_scores(queries: list[np.ndarray], documents: list[np.ndarray]) -> np.ndarray:
    """pylate.scores.colbert_scores: for each query token the best dot product with a
    document token, summed over the query's tokens; [queries, documents]."""
    return np.array([[float((q @ d.T).max(axis=1).sum()) for d in documents] for q in queries])
