"""What the Hugging Face cache holds, and whether embedserve can serve each model in it.

Owns ``embedserve model list``'s data: one ``CachedModel`` per cached model
revision, read with huggingface_hub's ``scan_cache_dir`` (the library's own
reading of its layout: ``models--ORG--NAME/{refs,snapshots,blobs}``) and judged
by the same config reader the engine loads with (no weights are read). Knows
nothing about printing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from embedserve.errors import ModelLoadError
from embedserve.model.config import load_model_config


@dataclass(frozen=True)
class CachedModel:
    name: str                     # ORG/NAME, with @REF when a ref other than main points here
    commit: str
    size_bytes: int
    snapshot: Path
    architecture: str | None      # from config.json, when it names a supported one
    servable_reason: str | None   # None: servable; else why not, in a few words


@dataclass(frozen=True)
class CachedModels:
    location: str                       # the cache that was scanned
    models: tuple[CachedModel, ...]     # sorted by name
    problems: tuple[str, ...]           # corrupted entries huggingface_hub skipped


def list_cached_models(cache_dir: Path | None = None) -> CachedModels:
    """Every model revision in the Hugging Face cache (``cache_dir``, default the library's own)."""
    from huggingface_hub import scan_cache_dir

    from embedserve.defaults.hub import cache_location

    location = cache_location(cache_dir)
    if not Path(location).is_dir():
        return CachedModels(location, (), ())
    info = scan_cache_dir(cache_dir)
    models = []
    for repo in info.repos:
        if repo.repo_type != "model":
            continue
        for revision in repo.revisions:
            refs = sorted(revision.refs)
            # main is what a bare id resolves to; other refs and unnamed commits need a suffix.
            suffix = "" if "main" in refs else f"@{refs[0]}" if refs else f"@{revision.commit_hash}"
            architecture, reason = servability(Path(revision.snapshot_path))
            models.append(CachedModel(repo.repo_id + suffix, revision.commit_hash,
                                      revision.size_on_disk, Path(revision.snapshot_path),
                                      architecture, reason))
    return CachedModels(location, tuple(sorted(models, key=lambda m: (m.name, m.commit))),
                        tuple(str(warning) for warning in info.warnings))


def servability(snapshot: Path) -> tuple[str | None, str | None]:
    """(architecture, None) when ``snapshot`` holds a model the engine loads, else (None, why)."""
    if not (snapshot / "config.json").is_file():
        return None, "no config.json"
    try:
        config = load_model_config(snapshot)
    except ModelLoadError as exc:
        return None, exc.message.replace(f"{snapshot}: ", "").replace(f"{snapshot}/", "")
    if not any(snapshot.glob("*.safetensors")):
        return config.architecture, "no safetensors weights"
    if not any((snapshot / name).is_file() for name in _TOKENIZER_FILES):
        return config.architecture, f"no tokenizer ({', '.join(_TOKENIZER_FILES)})"
    return config.architecture, None


# Any one of these is a tokenizer the engine loads (tokenizer/tokenizer.py).
_TOKENIZER_FILES = ("tokenizer.json", "sentencepiece.bpe.model", "vocab.txt")
