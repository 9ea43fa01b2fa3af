"""What a launcher checks before it starts any child process.

A child that fails to start costs seconds (a Python start, torch's import)
and its failure reaches the user second-hand; what can be known here is
checked here, each failure a ``StartupError`` naming the cause and the fix:
the model directory (exists, a config of a supported architecture, weights
and tokenizer files; torch-free: ``model/config.py`` parses the config), the
cache directory (writable, not full), the gateway's address (free). Anything
found only by loading the model is the child's to report.
"""

from __future__ import annotations

import errno
import shutil
import tempfile
from pathlib import Path

from embedserve.entrypoint import StartupError
from embedserve.errors import ModelLoadError
from embedserve.gateway.cli import listening_socket
from embedserve.model.config import load_model_config

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
TOKENIZER_FILES = ("tokenizer.json", "sentencepiece.bpe.model", "vocab.txt")
# Below this, a start that writes calibration ranges or compiled kernels may fail half-way.
MIN_FREE_CACHE_BYTES = 64 << 20
MODEL_DIR_FIX = ("give --model a model directory (config.json, weights, tokenizer files), "
                 "or leave --model out for the default model")


def check_model_dir(path: Path) -> None:
    """``path`` is a model directory this engine can serve, as far as its files tell."""
    if not path.exists():
        raise StartupError(f"model directory not found: {path}", MODEL_DIR_FIX)
    if not path.is_dir():
        raise StartupError(f"--model {path} is not a directory", MODEL_DIR_FIX)
    try:
        load_model_config(path)
    except ModelLoadError as exc:
        fix = "" if "; " in exc.message else MODEL_DIR_FIX
        raise StartupError(f"--model {path}: {exc.message}", fix) from None
    if not any((path / name).is_file() for name in WEIGHT_FILES):
        raise StartupError(f"--model {path}: no weights ({', '.join(WEIGHT_FILES)})",
                           "copy the model's weights into the directory (safetensors preferred)")
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise StartupError(f"--model {path}: no tokenizer ({', '.join(TOKENIZER_FILES)})",
                           "copy the model's tokenizer files into the directory")


def check_cache_dir(path: Path) -> None:
    """``path`` can be created, written, and has some room left."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-check-"):
            pass
    except OSError as exc:
        raise StartupError(f"cache directory {path} is not writable: {exc.strerror or exc}",
                           "make it writable or point --cache-dir (or EMBEDSERVE_CACHE_DIR) "
                           "at a writable directory") from None
    free = shutil.disk_usage(path).free
    if free < MIN_FREE_CACHE_BYTES:
        raise StartupError(f"no space for caches: {free >> 20} MiB free in {path}",
                           "free space there or point --cache-dir (or EMBEDSERVE_CACHE_DIR) "
                           "at a disk with room")


def check_port_free(host: str, port: int) -> None:
    """``host:port`` can be bound now (port 0: always). Bound as the gateway binds it, then
    released: another process could still take it first, and then the bind itself fails
    with the same kind of line."""
    if port == 0:
        return
    try:
        listening_socket(host, port).close()
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise StartupError(f"port {port} on {host} is already in use",
                               "pick another --port (0 picks a free one) or stop the process "
                               "that holds it") from None
        raise StartupError(f"cannot listen on {host}:{port}: {exc.strerror or exc}",
                           "give --host an address of this machine (127.0.0.1, 0.0.0.0) and "
                           "--port a free port") from None
