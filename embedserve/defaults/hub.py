"""Models named by their Hugging Face Hub id (``org/name[@revision]``).

Owns: telling a Hub id from a directory, finding a Hub model's snapshot in the
Hugging Face cache (no network when it is there), downloading only the files
the engine reads when it is not, and turning every failure into one
``ModelLoadError`` line that names the cause and the fix. The cache location,
the token and offline mode are ``huggingface_hub``'s own (HF_HOME,
HF_HUB_CACHE, HF_TOKEN, HF_HUB_OFFLINE, read by that library, not here).
Knows nothing about serving; imports ``huggingface_hub`` only when a Hub id is
actually resolved, so a command given a directory never pays for it.

The rule for a ``--model`` value: a path that exists locally wins; else a
value shaped ``org/name`` or ``org/name@revision`` is a Hub id; anything else
is a directory (and fails as a missing one). ``./org/name`` forces a directory.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from embedserve.errors import ModelLoadError

# The files the engine, the tokenizer and the sentence-transformers metadata
# reader open (engine/weights.py, tokenizer/tokenizer.py, model/config.py);
# nothing else of a repo is downloaded (no .bin/.onnx/.h5 copies of the weights).
# fnmatch patterns, as huggingface_hub's allow_patterns takes them.
ENGINE_FILES: tuple[str, ...] = (
    "config.json",
    "model.safetensors", "model.safetensors.index.json", "model-*-of-*.safetensors",
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt",
    "sentencepiece.bpe.model",
    "modules.json", "config_sentence_transformers.json", "sentence_bert_config.json",
    "1_Pooling/*", "2_Dense/*",
)

# org/name, each part as the Hub allows it (letters, digits, '-', '_', '.');
# an optional @revision (a branch, tag or commit; may hold '/', e.g. refs/pr/1).
_HUB_ID = re.compile(r"(?P<repo>[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*)(?:@(?P<revision>[^\s@]+))?")


@dataclass(frozen=True)
class HubModel:
    """A model repo on the Hub; ``revision`` None means the repo's default branch."""

    repo_id: str
    revision: str | None = None

    def __str__(self) -> str:
        return self.repo_id + (f"@{self.revision}" if self.revision else "")


def parse_hub_id(text: str) -> HubModel | None:
    """``org/name[@revision]`` -> HubModel; None when ``text`` is not shaped like a Hub id."""
    match = _HUB_ID.fullmatch(text)
    if match is None:
        return None
    return HubModel(match["repo"], match["revision"])


def model_source(text: str) -> Path | HubModel:
    """What a ``--model`` value names: an existing local path wins, then a Hub id, else a path."""
    path = Path(text)
    if path.exists():
        return path
    return parse_hub_id(text) or path


def engine_files(repo_files: Iterable[str]) -> list[str]:
    """Those of ``repo_files`` a download fetches (``ENGINE_FILES``), as huggingface_hub selects them."""
    from huggingface_hub.utils import filter_repo_objects

    return list(filter_repo_objects(repo_files, allow_patterns=list(ENGINE_FILES)))


def cache_location(cache_dir: Path | None) -> str:
    """The Hub cache ``cache_dir`` stands for: huggingface_hub's own (HF_HUB_CACHE) when None."""
    if cache_dir is not None:
        return str(cache_dir)
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def resolve_hub_model(model: HubModel, cache_dir: Path | None = None,
                      on_download: Callable[[str], None] = lambda message: None) -> Path:
    """The local snapshot of ``model``: from the cache without any network call when it is
    complete there, else downloaded once (``on_download`` is told first). ModelLoadError
    (one line: the cause and the fix) when it cannot be had or cannot be served."""
    cached = cached_snapshot(model, cache_dir)
    if cached is not None and _missing_files(cached) is None:
        return cached
    return pull_hub_model(model, cache_dir, on_download)


def cached_snapshot(model: HubModel, cache_dir: Path | None = None) -> Path | None:
    """``model``'s snapshot in the cache (the one its revision's ref points to), or None."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(model.repo_id, revision=model.revision, cache_dir=cache_dir,
                                      allow_patterns=list(ENGINE_FILES), local_files_only=True))
    except LocalEntryNotFoundError:   # IncompleteSnapshotError included: not usable as it is
        return None
    except ValueError as exc:         # HFValidationError: not a valid repo id
        raise ModelLoadError(f"{model}: not a valid Hugging Face Hub id ({exc}); give org/name "
                             "or a model directory") from None


def pull_hub_model(model: HubModel, cache_dir: Path | None = None,
                   on_download: Callable[[str], None] = lambda message: None) -> Path:
    """Ask the Hub for ``model``'s current files (only ``ENGINE_FILES``) and fetch what the
    cache lacks; offline (HF_HUB_OFFLINE), the cached snapshot. ModelLoadError as above."""
    from huggingface_hub import constants, snapshot_download

    offline = constants.is_offline_mode()
    if not offline:
        on_download(f"embedserve: downloading {model} from the Hugging Face Hub into "
                    f"{cache_location(cache_dir)} (its config, safetensors weights and tokenizer) ...")
    try:
        path = Path(snapshot_download(model.repo_id, revision=model.revision, cache_dir=cache_dir,
                                      allow_patterns=list(ENGINE_FILES)))
    except Exception as exc:   # the library's, translated here at the boundary that sees them
        raise hub_error(model, exc, cache_dir) from exc
    missing = _missing_files(path)
    if missing is not None:
        if offline:
            raise ModelLoadError(
                f"the cached snapshot of {model} in {cache_location(cache_dir)} has no {missing} and "
                f"HF_HUB_OFFLINE=1; run `embedserve model pull {model}` where the Hub is reachable")
        raise ModelLoadError(_NOT_SERVABLE[missing].format(model=model))
    return path


_NOT_SERVABLE = {
    "config.json": "{model} has no config.json: it is not a transformers model embedserve can "
                   "serve; pick a repo with config.json and safetensors weights, or pass a model "
                   "directory",
    "safetensors weights": "{model} has no safetensors weights (model.safetensors): embedserve "
                           "loads safetensors only; pick a repo or revision that has them, or "
                           "convert the weights and pass the directory",
}


def _missing_files(snapshot: Path) -> str | None:
    """What of a servable model ``snapshot`` lacks (a key of ``_NOT_SERVABLE``), or None."""
    if not (snapshot / "config.json").is_file():
        return "config.json"
    if not any(snapshot.glob("*.safetensors")):
        return "safetensors weights"
    return None


def hub_error(model: HubModel, exc: Exception, cache_dir: Path | None) -> ModelLoadError:
    """One line for a huggingface_hub failure to get ``model``: the cause, then the fix."""
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        IncompleteSnapshotError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    cache = cache_location(cache_dir)
    pull = f"run `embedserve model pull {model}` where the Hub is reachable"
    if isinstance(exc, RevisionNotFoundError):
        return ModelLoadError(f"{model.repo_id} has no revision {model.revision!r} on the Hugging "
                              "Face Hub; give a branch, tag or commit it has "
                              f"({model.repo_id}@REVISION or --revision)")
    if isinstance(exc, GatedRepoError):
        return ModelLoadError(f"{model.repo_id} is gated on the Hugging Face Hub; accept its terms on "
                              f"https://huggingface.co/{model.repo_id} and set HF_TOKEN to a token "
                              "of that account (or run `hf auth login`)")
    if isinstance(exc, RepositoryNotFoundError) or (
            isinstance(exc, HfHubHTTPError) and exc.response is not None
            and exc.response.status_code == 401):
        return ModelLoadError(f"{model.repo_id} is not on the Hugging Face Hub, or is private and "
                              "HF_TOKEN is unset or lacks access to it; check the id, or set "
                              "HF_TOKEN (or run `hf auth login`)")
    if isinstance(exc, LocalEntryNotFoundError):
        if isinstance(exc.__cause__, OfflineModeIsEnabled):
            return ModelLoadError(f"{model} is not in the Hugging Face cache ({cache}) and "
                                  f"HF_HUB_OFFLINE=1; {pull}, or pass a model directory")
        if isinstance(exc, IncompleteSnapshotError):   # some of the files, and no network
            return ModelLoadError(f"the cached snapshot of {model} in {cache} is incomplete and the "
                                  f"Hugging Face Hub cannot be reached; {pull}")
        cause = exc.__cause__ or exc
        return ModelLoadError(f"cannot reach the Hugging Face Hub to download {model} "
                              f"({type(cause).__name__}: {_first_line(cause)}) and it is not in "
                              f"the cache ({cache}); check the network (HF_ENDPOINT, proxies), or "
                              f"{pull} and share the cache (HF_HOME)")
    if isinstance(exc, HfHubHTTPError):
        return ModelLoadError(f"the Hugging Face Hub refused {model} ({_first_line(exc)}); "
                              f"retry later, or {pull}")
    if isinstance(exc, ValueError):   # HFValidationError: not a valid repo id
        return ModelLoadError(f"{model}: not a valid Hugging Face Hub id ({_first_line(exc)}): "
                              "give org/name or a model directory")
    if isinstance(exc, OSError):      # disk full, unwritable cache, a connection cut mid-file
        return ModelLoadError(f"downloading {model} into {cache} failed "
                              f"({type(exc).__name__}: {_first_line(exc)}); check free space and "
                              "that the cache is writable (HF_HOME, HF_HUB_CACHE), then retry")
    return ModelLoadError(f"getting {model} from the Hugging Face Hub failed "
                          f"({type(exc).__name__}: {_first_line(exc)})")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
