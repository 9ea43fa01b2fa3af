"""Which module class and which checkpoint-name mapping serve each model family.

Owns the engine side of the family registry (model/config.py owns the config
side): ``FAMILIES[config.family]`` builds the model from its config and maps
a checkpoint's Hugging Face names onto it. A new family joins with one entry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import nn

from embedserve.engine.bert_variant_names import map_distilbert_names, map_mpnet_names
from embedserve.engine.deberta_v2_names import map_deberta_v2_names
from embedserve.engine.decoder_names import map_decoder_names
from embedserve.engine.gemma3_names import map_gemma3_names
from embedserve.engine.llm_head import add_score_head
from embedserve.engine.modules.bert import EncoderModel
from embedserve.engine.modules.deberta_v2 import DebertaV2Model
from embedserve.engine.modules.decoder import DecoderModel
from embedserve.engine.modules.gemma3 import Gemma3Model
from embedserve.engine.modules.modernbert import ModernBertModel
from embedserve.engine.modules.mpnet import MPNetModel
from embedserve.engine.modules.nomic_bert import NomicBertModel
from embedserve.engine.nomic_bert_names import map_nomic_bert_names
from embedserve.engine.weights import map_hf_names


@dataclass(frozen=True)
class FamilyRuntime:
    model: Callable[[Any], nn.Module]                                      # config -> module
    map_names: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]  # HF names -> ours
    # (config, checkpoint tensors, mapped) -> mapped with what needs the config (a head)
    complete: Callable[[Any, dict[str, torch.Tensor], dict[str, torch.Tensor]],
                       dict[str, torch.Tensor]] | None = None


FAMILIES: dict[str, FamilyRuntime] = {
    "bert": FamilyRuntime(EncoderModel, partial(map_hf_names, family="bert")),
    "xlm-roberta": FamilyRuntime(EncoderModel, partial(map_hf_names, family="xlm-roberta")),
    "modernbert": FamilyRuntime(ModernBertModel, partial(map_hf_names, family="modernbert")),
    **{family: FamilyRuntime(DecoderModel, map_decoder_names, add_score_head)
       for family in ("qwen3", "qwen2", "llama", "mistral")},
    "distilbert": FamilyRuntime(EncoderModel, map_distilbert_names),
    "mpnet": FamilyRuntime(MPNetModel, map_mpnet_names),
    "deberta-v2": FamilyRuntime(DebertaV2Model, map_deberta_v2_names),
    "nomic-bert": FamilyRuntime(NomicBertModel, map_nomic_bert_names),
    "gemma3": FamilyRuntime(Gemma3Model, map_gemma3_names),
}
