"""What the gateway knows about the served model without loading its weights.

Owns reading the model directory's ``config.json`` and sentence-transformers
metadata (through the engine's readers, which touch no weights) into the
facts the routes need: task, position limit, vocabulary size, default
normalization, and the named prompts (templates such as ``query: ``).
Replicas report the rest (dimension, model id) through ``Info``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from embedserve.model.config import load_encoder_config, load_sentence_transformer_meta
from embedserve.errors import InvalidInput


@dataclass(frozen=True)
class ModelMeta:
    model_id: str
    task: str                      # "embed" or "score"
    max_positions: int             # longest sequence, specials included
    vocab_size: int
    dimension: int                 # embedding width; 0 for a scorer
    normalize: bool                # the model's default (a Normalize module)
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None

    def prompt(self, name: str | None, field_name: str) -> str:
        """The prefix for prompt ``name`` (None: the model's default, if any)."""
        if name is None:
            name = self.default_prompt_name
            if name is None:
                return ""
        if name not in self.prompts:
            known = ", ".join(sorted(self.prompts)) or "none"
            raise InvalidInput(f"{field_name}: unknown prompt {name!r}; this model has: {known}",
                               field=field_name)
        return self.prompts[name]


def load_model_meta(model_dir: Path) -> ModelMeta:
    """Read ``model_dir``; raises ``ModelLoadError`` when it is unusable."""
    config = load_encoder_config(model_dir)
    meta = load_sentence_transformer_meta(model_dir, config)
    return ModelMeta(
        model_id=model_dir.name,
        task=config.task,
        max_positions=config.max_positions,
        vocab_size=config.vocab_size,
        dimension=config.hidden_size if config.task == "embed" else 0,
        normalize=meta.normalize,
        prompts=dict(meta.prompts),
        default_prompt_name=meta.default_prompt_name,
    )
