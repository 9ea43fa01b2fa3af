"""The replica token on disk, and the ``--replica-token-file`` flag.

``embedserve scheduler`` and ``embedserve gateway`` take the same flag (or
$EMBEDSERVE_REPLICA_TOKEN_FILE) and read the token at start-up into their
settings; ``embedserve serve`` / ``cluster`` make a fresh token per run.
The gRPC side of the protocol is ``auth.py``; this module imports no grpc,
so ``embedserve --help`` stays cheap.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

# Where entry points look when the flag is not given.
TOKEN_FILE_ENV = "EMBEDSERVE_REPLICA_TOKEN_FILE"


def read_token_file(path: str | Path) -> str:
    """The token in ``path``, surrounding whitespace removed; ValueError if it is empty."""
    token = Path(path).read_text(encoding="utf-8").strip()
    if not token:
        raise ValueError(f"replica token file {path} is empty")
    return token


@contextlib.contextmanager
def temporary_token_file() -> Iterator[Path]:
    """A fresh random token in a 0600 file in a private (0700) directory, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="embedserve-token-") as directory:
        path = Path(directory) / "replica-token"
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w", encoding="utf-8") as file:
            file.write(secrets.token_urlsafe(32))
        yield path


def add_replica_token_argument(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--replica-token-file", type=Path, default=None, metavar="PATH",
                        help=f"{what} (also ${TOKEN_FILE_ENV}; default: no token)")


def replica_token_from_args(args: argparse.Namespace, environ: Mapping[str, str]) -> str | None:
    """The token in ``--replica-token-file``, else in $EMBEDSERVE_REPLICA_TOKEN_FILE; None when neither.

    A named file that cannot be read, or is empty, ends the command with a
    message: starting without the token would leave the replicas open.
    """
    path = args.replica_token_file or environ.get(TOKEN_FILE_ENV) or None
    if path is None:
        return None
    try:
        return read_token_file(path)
    except (OSError, ValueError) as error:
        raise SystemExit(f"--replica-token-file: {error}") from None
