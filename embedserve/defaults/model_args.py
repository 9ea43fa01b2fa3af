"""``--model`` / ``--cache-dir`` for every command that serves a model.

An entry-point helper: the one place that reads ``EMBEDSERVE_CACHE_DIR`` to pick
where the default model is built. Imports neither torch nor the engine until a
default model must actually be built, so the gateway's CLI stays light.

Commands that serve several models (``serve``, ``cluster``, ``gateway``) take
``--model`` once per model, with per-model options after the directory::

    --model DIR[:name=NAME[,ALIAS...]][:replicas=N][:upstream=HOST:PORT[,...]|dns:NAME:PORT]

An option starts at a ``:`` followed by one of the keys, so directories
and addresses keep their own colons; an empty DIR is the default model.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path


def default_cache_dir() -> Path:
    """$EMBEDSERVE_CACHE_DIR, else ~/.cache/embedserve/models."""
    configured = os.environ.get("EMBEDSERVE_CACHE_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "embedserve" / "models"


CACHE_DIR_HELP = "where the default model is built (default: $EMBEDSERVE_CACHE_DIR or ~/.cache/embedserve/models)"


def add_model_arguments(parser: argparse.ArgumentParser, model_help: str) -> None:
    """``--model`` and ``--cache-dir``, as every serving command takes them."""
    parser.add_argument("--model", type=Path, default=None, help=model_help)
    parser.add_argument("--cache-dir", type=Path, default=None, help=CACHE_DIR_HELP)


def model_dir_from_args(args: argparse.Namespace) -> Path:
    """``--model``, else the default model, built into ``--cache-dir`` on first use."""
    if args.model is not None:
        return args.model
    return _default_model_dir(args.cache_dir)


def _default_model_dir(cache_dir: Path | None) -> Path:
    from embedserve.defaults.build import default_model_path, ensure_default_model, is_current_build

    cache_dir = cache_dir or default_cache_dir()
    if not is_current_build(default_model_path(cache_dir)):
        print("embedserve: building the default model (once, on first use) ...",
              file=sys.stderr, flush=True)
    return ensure_default_model(cache_dir)


# ":" followed by an option key starts an option; any other ":" is part of a value.
_OPTION = re.compile(r":(?=(?:name|replicas|upstream)=)")
MODEL_SPEC_HELP = ("DIR[:name=NAME[,ALIAS...]]{keys}: a model directory (empty: "
                   "the default model, multilingual-e5-small, built on first use into --cache-dir) "
                   "and its options: the names a request's 'model' may use (the first is the one "
                   "answers carry; default: the directory's name){replicas}{upstream_help}. Repeat "
                   "--model to serve several models behind one gateway; requests pick one by "
                   "'model'")


@dataclass(frozen=True)
class ModelSpec:
    """One ``--model`` of a command that serves several; None fields were not given."""

    path: Path | None                  # None: the default model
    names: tuple[str, ...] = ()
    replicas: int | None = None
    upstream: str | None = None        # host:port[,host:port...] or dns:NAME:PORT

    def format(self) -> str:
        """The ``--model`` value that parses back to this spec."""
        parts = [str(self.path) if self.path is not None else ""]
        if self.names:
            parts.append("name=" + ",".join(self.names))
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
    return ModelSpec(Path(path) if path else None, names, replicas, values.get("upstream"))


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
                        metavar="DIR[:OPTIONS]", help=help_text)
    parser.add_argument("--cache-dir", type=Path, default=None, help=CACHE_DIR_HELP)


def model_specs_from_args(args: argparse.Namespace) -> list[ModelSpec]:
    """Every ``--model`` with its directory resolved (the default model when none is given)."""
    specs = args.model or [ModelSpec(None)]
    resolved = []
    for spec in specs:
        path = spec.path if spec.path is not None else _default_model_dir(args.cache_dir)
        resolved.append(ModelSpec(path, spec.names, spec.replicas, spec.upstream))
    return resolved
