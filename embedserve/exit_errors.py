"""How a failed ``embedserve`` command ends: one line on stderr and an exit status.

The error contract of the command line (docs/cli.md): whatever stops a
command prints exactly one line, ``embedserve: error: CAUSE; WHAT TO DO``,
and exits with

- 2: the user can fix it (a flag, a path, a model directory, a port in use,
  a full or unwritable disk, a child process that could not start for one of
  these reasons);
- 1: an unexpected error (a bug): the line names the exception and asks for
  ``--debug``.

No traceback unless debugging is on (``--debug`` or ``EMBEDSERVE_DEBUG=1``,
read at the entry point): then the traceback comes first and the line last.
Owns the translation of exceptions (``StartupError``, the closed error tree,
``OSError`` by errno, a string ``SystemExit``) into that line, and nothing
else: the launchers and entry-point helpers raise, this module only reports.
"""

from __future__ import annotations

import argparse
import errno
import sys
import traceback
from collections.abc import Callable
from typing import TextIO

from embedserve.entrypoint import StartupError, error_line
from embedserve.errors import EmbedServeError, ModelLoadError

EXIT_USAGE = 2        # the user can fix it
EXIT_INTERNAL = 1     # a bug: --debug shows where

MODEL_FIX = ("give --model a model directory holding config.json, the weights "
             "(model.safetensors) and tokenizer files (tokenizer.json or "
             "sentencepiece.bpe.model); docs/cli.md lists what is supported")
CACHE_FIX = ("free space there or point the caches elsewhere: --cache-dir or "
             "EMBEDSERVE_CACHE_DIR (models, calibration), NUMBA_CACHE_DIR (compiled "
             "tokenizer kernels), HF_HOME (the Hugging Face cache)")
PORT_FIX = "pick another --port (0 picks a free one) or stop the process that holds it"
DEBUG_HINT = "rerun with --debug (or EMBEDSERVE_DEBUG=1) for the traceback"


def describe(exc: BaseException) -> tuple[str, int]:
    """The message (cause; what to do) and the exit status for ``exc``."""
    if isinstance(exc, StartupError):
        return str(exc), EXIT_USAGE
    if isinstance(exc, ModelLoadError):
        # Messages that already say what to do carry a "; ".
        return (exc.message if "; " in exc.message else f"{exc.message}; {MODEL_FIX}"), EXIT_USAGE
    if isinstance(exc, EmbedServeError):
        return exc.message, EXIT_USAGE
    if isinstance(exc, OSError):
        return _describe_os_error(exc), EXIT_USAGE
    if isinstance(exc, SystemExit):    # raise SystemExit("message"): a usage error
        return str(exc.code), EXIT_USAGE
    return f"unexpected {type(exc).__name__}: {exc}; {DEBUG_HINT}, and report it", EXIT_INTERNAL


def _describe_os_error(exc: OSError) -> str:
    where = f" ({exc.filename})" if exc.filename else ""
    reason = exc.strerror or str(exc)
    if exc.errno == errno.EADDRINUSE:
        return f"address already in use{where}; {PORT_FIX}"
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"{reason}{where}; {CACHE_FIX}"
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR):
        return f"cannot write{where}: {reason}; make it writable, or {CACHE_FIX[CACHE_FIX.index('point'):]}"
    if exc.errno == errno.ENOENT:
        return f"not found{where}: {reason}; check the path"
    return f"{reason}{where}; {DEBUG_HINT}"


def report(exc: BaseException, debug: bool, stream: TextIO | None = None) -> int:
    """Print ``exc`` as one error line (its traceback first when ``debug``); the exit status."""
    stream = stream or sys.stderr
    message, status = describe(exc)
    if debug:
        traceback.print_exception(exc, file=stream)
    print(error_line(message), file=stream, flush=True)
    return status


def run_reporting(command: Callable[[argparse.Namespace], int | None], args: argparse.Namespace,
                  debug: bool) -> int:
    """``command(args)``'s exit status; a failure reported as one line (``report``)."""
    try:
        return int(command(args) or 0)
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return int(exc.code or 0)
        return report(exc, debug)
    except KeyboardInterrupt:      # Ctrl-C before the stop signals were handled
        return 130
    except Exception as exc:       # noqa: BLE001 - the entry point reports every failure
        return report(exc, debug)


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one error line and exit status 2.

    argparse prints the usage block then ``PROG: error: MESSAGE``; the contract is
    one line, so the usage is replaced by where to find it.
    """

    def error(self, message: str) -> None:   # type: ignore[override]
        print(error_line(f"{message}; see {self.prog} --help"), file=sys.stderr, flush=True)
        raise SystemExit(EXIT_USAGE)
