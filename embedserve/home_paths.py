"""``~`` in a cache path, where it has a meaning.

Owns one question: what a path such as ``~/.cache/embedserve/tokenizer`` is on this
machine. A uid without a passwd entry and no ``$HOME`` (a container run as an arbitrary
uid) has no home, and ``Path.expanduser`` raises there; the callers decide what that
means: no disk cache (the tokenizer's trie, the probe's token ids) or a one-line start-up
error (the default model's cache directory, defaults/model_args.py).
"""

from __future__ import annotations

from pathlib import Path


def expand_home(path: str | Path | None) -> Path | None:
    """``path`` with a leading ``~`` expanded; None where there is no home to expand it to
    (and for None: no cache)."""
    if path is None:
        return None
    try:
        return Path(path).expanduser()
    except RuntimeError:
        return None
