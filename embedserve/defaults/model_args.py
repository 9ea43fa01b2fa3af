"""``--model`` / ``--cache-dir`` for every command that serves a model.

An entry-point helper: the one place that reads ``EMBEDSERVE_CACHE_DIR`` to pick
where the default model is built. Imports neither torch nor the engine until a
default model must actually be built, so the gateway's CLI stays light.

Commands that serve several models (``serve``, ``cluster``, ``gateway``) take
``--model`` once per model, with per-model options after the directory::

    --model DIR[:name=NAME[,ALIAS...]][:replicas=N][:upstream=HOST:PORT[,...]|dns:NAME:PORT]

An option starts at a ``:`` followed by one of the keys, so directories
and addresses keep their own colons; an empty DIR is the default model.

DIR may instead be a Hugging Face Hub id, ``org/name[@revision]`` (rule and
resolution: ``embedserve.defaults.hub``): it is resolved here, in the process
that parsed the flags, into its snapshot in the Hugging Face cache (downloaded
first if missing), so the processes started after it get a directory; its
served name defaults to the id.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from embedserve.defaults.hub import HubModel, model_source, resolve_hub_model
from embedserve.entrypoint import StartupError
from embedserve.home_paths import expand_home


def default_cache_dir() -> Path:
    """$EMBEDSERVE_CACHE_DIR, else ~/.cache/embedserve/models; a StartupError where ``~``
    has no meaning (no HOME, and a uid without a passwd entry: a container run as an
    arbitrary uid)."""
    configured = os.environ.get("EMBEDSERVE_CACHE_DIR")
    if configured:
        return Path(configured)
    models = expand_home("~/.cache/embedserve/models")
    if models is None:
        raise StartupError(f"no home directory for the caches: HOME is not set and uid {os.getuid()} has no "
                           "passwd entry", "set HOME, or EMBEDSERVE_CACHE_DIR, to a writable directory")
    return models


CACHE_DIR_HELP = "where the default model is built (default: $EMBEDSERVE_CACHE_DIR or ~/.cache/embedserve/models)"


HUB_HELP = (" or a Hugging Face Hub id, org/name[@REVISION], served from the Hugging Face cache "
            "(HF_HOME, HF_HUB_CACHE) and downloaded into it first if missing; a path that exists "
            "wins, ./org/name forces one")
REVISION_HELP = ("the branch, tag or commit of a --model given as a Hub id (default: the repo's "
                 "main branch; org/name@REVISION says the same for one model)")


def add_model_arguments(parser: argparse.ArgumentParser, model_help: str) -> None:
    """``--model``, ``--revision`` and ``--cache-dir``, as every serving command takes them."""
    # str, not Path: Path("./org/name") would drop the "./" that marks a directory.
    parser.add_argument("--model", default=None, help=model_help + HUB_HELP)
    parser.add_argument("--revision", default=None, help=REVISION_HELP)
    parser.add_argument("--cache-dir", type=Path, default=None, help=CACHE_DIR_HELP)


def model_dir_from_args(args: argparse.Namespace) -> Path:
    """``--model`` (a Hub id resolved to its cached snapshot), else the default model,
    built into ``--cache-dir`` on first use. ModelLoadError when a Hub id cannot be had."""
    revision = getattr(args, "revision", None)
    if args.model is None:
        _check_revision_applies(revision, [])
        return _default_model_dir(args.cache_dir)
    source = model_source(args.model)
    if isinstance(source, HubModel):
        return _hub_model_dir(with_revision(source, revision))
    _check_revision_applies(revision, [])
    return source


def _hub_model_dir(model: HubModel) -> Path:
    def announce(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    return resolve_hub_model(model, on_download=announce)


def with_revision(model: HubModel, revision: str | None) -> HubModel:
    """``model`` at ``--revision`` when it names none of its own; SystemExit on two different ones."""
    if revision is None or model.revision == revision:
        return model
    if model.revision is not None:
        raise SystemExit(f"--model {model} and --revision {revision} name two revisions; give one")
    return HubModel(model.repo_id, revision)


def _check_revision_applies(revision: str | None, hub_models: list[HubModel]) -> None:
    if revision is not None and not hub_models:
        raise SystemExit(f"--revision {revision}: it applies to a --model given as a Hugging Face "
                         "Hub id (org/name), and none is")


def _default_model_dir(cache_dir: Path | None) -> Path:
    from embedserve.defaults.build import default_model_path, ensure_default_model, is_current_build

    cache_dir = cache_dir or default_cache_dir()
    if not is_current_build(default_model_path(cache_dir)):
        print("embedserve: building the default model (once, on first use) ...",
              file=sys.stderr, flush=True)
    return ensure_default_model(cache_dir)


# ":" followed by an option key starts an option; any other ":" is part of a value.
_OPTION = re.compile(r":(?=(?:name|replicas|upstream)=)")
MODEL_SPEC_HELP = ("MODEL[:name=NAME[,ALIAS...]]{keys}: a model directory (empty: "
                   "the default model, multilingual-e5-small, built on first use into --cache-dir; "
                   "or a Hugging Face Hub id, org/name[@REVISION], served from the Hugging Face "
                   "cache and downloaded into it first if missing; a path that exists wins) "
                   "and its options: the names a request's 'model' may use (the first is the one "
                   "answers carry; default: the Hub id, else the directory's name)"
                   "{replicas}{upstream_help}. Repeat "
                   "--model to serve several models behind one gateway; requests pick one by "
                   "'model'")


@dataclass(frozen=True)
class ModelSpec:
    """One ``--model`` of a command that serves several; None fields were not given."""

    path: Path | None                  # None: the default model, or ``hub`` not yet resolved
    names: tuple[str, ...] = ()
    replicas: int | None = None
    upstream: str | None = None        # host:port[,host:port...] or dns:NAME:PORT
    hub: HubModel | None = None        # given as a Hub id; ``path`` is its snapshot once resolved

    @property
    def model_dir(self) -> Path:
        """``path`` of a spec model_specs_from_args returned: resolved, never None."""
        assert self.path is not None, "a ModelSpec not resolved by model_specs_from_args"
        return self.path

    @property
    def served_names(self) -> tuple[str, ...]:
        """``names``, else the Hub id (without revision); empty: the directory's name."""
        return self.names or ((self.hub.repo_id,) if self.hub is not None else ())

    def format(self) -> str:
        """The ``--model`` value that parses back to this spec (a resolved Hub model: to its
        snapshot directory, named by the Hub id)."""
        if self.path is not None:
            parts = [str(self.path)]
        else:
            parts = [str(self.hub) if self.hub is not None else ""]
        if self.served_names:
            parts.append("name=" + ",".join(self.served_names))
        if self.replicas is not None:
            parts.append(f"replicas={self.replicas}")
        if self.upstream is not None:
            parts.append(f"upstream={self.upstream}")
        return ":".join(parts)


def parse_model_spec(text: str) -> ModelSpec:
    """``DIR[:name=...][:replicas=N][:upstream=...]`` -> ModelSpec; ArgumentTypeError if malformed."""
    path, *options = _OPTION.split(text)
    values: dict[str, str] = {}
    for option in options:
        key, _, value = option.partition("=")
        if key in values:
            raise argparse.ArgumentTypeError(f"{text!r}: {key}= is given twice")
        if not value:
            raise argparse.ArgumentTypeError(f"{text!r}: {key}= needs a value")
        values[key] = value
    names = tuple(n.strip() for n in values.get("name", "").split(",") if n.strip())
    if "name" in values and not names:
        raise argparse.ArgumentTypeError(f"{text!r}: name= needs at least one name")
    replicas = None
    if "replicas" in values:
        if not values["replicas"].isdigit() or int(values["replicas"]) < 1:
            raise argparse.ArgumentTypeError(f"{text!r}: replicas= must be a whole number of at least 1")
        replicas = int(values["replicas"])
    source = model_source(path) if path else None
    if isinstance(source, HubModel):
        return ModelSpec(None, names, replicas, values.get("upstream"), hub=source)
    return ModelSpec(source, names, replicas, values.get("upstream"))


def add_model_spec_arguments(parser: argparse.ArgumentParser, *, replicas: bool,
                             upstream: bool) -> None:
    """A repeatable ``--model DIR[:options]`` and ``--cache-dir``, for commands serving several models.

    ``replicas`` / ``upstream``: whether this command takes those options.
    """
    keys = ("[:replicas=N]" if replicas else "") + ("[:upstream=ADDRESSES]" if upstream else "")
    help_text = MODEL_SPEC_HELP.format(
        keys=keys,
        replicas="; how many replicas to start for it (default: --replicas)" if replicas else "",
        upstream_help="; its replicas, as --upstream takes them (needed for each model when there "
                      "are several)" if upstream else "")
    parser.add_argument("--model", type=parse_model_spec, action="append", default=None,
                        metavar="MODEL[:OPTIONS]", help=help_text)
    parser.add_argument("--revision", default=None,
                        help=REVISION_HELP.replace("for one model", "per model"))
    parser.add_argument("--cache-dir", type=Path, default=None, help=CACHE_DIR_HELP)


def model_specs_from_args(args: argparse.Namespace) -> list[ModelSpec]:
    """Every ``--model`` with its directory resolved: a Hub id to its snapshot in the Hugging
    Face cache (downloaded first if missing: ModelLoadError when it cannot be), none to the
    default model."""
    specs = args.model or [ModelSpec(None)]
    revision = getattr(args, "revision", None)
    _check_revision_applies(revision, [spec.hub for spec in specs if spec.hub is not None])
    specs = [replace(spec, hub=with_revision(spec.hub, revision)) if spec.hub is not None else spec
             for spec in specs]
    resolved = []
    for spec in specs:
        if spec.hub is not None:
            path = _hub_model_dir(spec.hub)
        elif spec.path is not None:
            path = spec.path
        else:
            path = _default_model_dir(args.cache_dir)
        resolved.append(replace(spec, path=path))
    return resolved
