"""Every way ``embedserve serve`` can fail before serving ends as one line and exit status 2.

Each test runs the real command (a subprocess, as a user would) into one
failure class and checks the contract of docs/cli.md: stderr is exactly one
line, ``embedserve: error: CAUSE; WHAT TO DO``, naming the cause; exit status
2; no traceback; and no process it started still running afterwards (pytest
is a child subreaper here, tests/leftover_processes.py: an orphaned replica
would be re-parented to it and show up among its descendants).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from embedserve.entrypoint import StartupError
from embedserve.errors import ModelLoadError
from embedserve.exit_errors import describe
from leftover_processes import live_descendants

ROOT = Path(__file__).resolve().parents[1]


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    """``embedserve ARGS`` to completion; fails the test if it left a process behind."""
    before = set(live_descendants(os.getpid()))
    environ = {name: value for name, value in os.environ.items() if name != "EMBEDSERVE_DEBUG"}
    environ.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", **(env or {}))
    done = subprocess.run([sys.executable, "-m", "embedserve.cli", *args], capture_output=True,
                          text=True, env=environ, cwd=str(ROOT), timeout=timeout, stdin=subprocess.DEVNULL)
    left = set(live_descendants(os.getpid())) - before
    assert not left, f"processes left behind: {sorted(left)}"
    return done


def assert_one_line(done: subprocess.CompletedProcess, *causes: str) -> str:
    lines = done.stderr.splitlines()
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert len(lines) == 1, done.stderr
    line = lines[0]
    assert line.startswith("embedserve: error: ")
    assert "; " in line   # the cause, then what to do
    for cause in causes:
        assert cause in line
    return line


def assert_error_last(done: subprocess.CompletedProcess, *causes: str) -> str:
    """For a failure met once processes run: their log lines may come first, but the one
    error line is the last, and there is no other (nor a traceback)."""
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    errors = [line for line in lines if "error" in line.lower()]
    assert errors == lines[-1:], done.stderr
    assert errors[0].startswith("embedserve: error: ") and "; " in errors[0]
    for cause in causes:
        assert cause in errors[0]
    return errors[0]


def serve(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return run_cli("serve", "--dtype", "float32", "--no-calibration", *args, **kwargs)


def test_a_missing_model_directory(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    assert_one_line(serve("--model", str(missing), "--port", "0"), "model directory not found",
                    str(missing))


def test_a_hub_id_that_is_neither_cached_nor_reachable(tmp_path: Path) -> None:
    # Offline with an empty Hub cache: whichever way --model resolves an ``org/name``
    # (a directory, or the Hub cache), the answer is one line naming it.
    done = serve("--model", "embedserve-test/no-such-model", "--port", "0",
                 env={"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")})
    assert_one_line(done, "embedserve-test/no-such-model")


def test_an_unsupported_architecture(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    line = assert_one_line(serve("--model", str(tmp_path), "--port", "0"),
                           "unsupported architecture 'GPT2LMHeadModel'")
    assert "BertModel" in line   # what is supported instead


def test_a_model_without_a_tokenizer(tmp_path: Path, tiny_bert_dir: Path) -> None:
    for name in ("config.json", "model.safetensors"):
        shutil.copy(tiny_bert_dir / name, tmp_path / name)
    assert_one_line(serve("--model", str(tmp_path), "--port", "0"), "no tokenizer", "tokenizer.json")


def test_an_unsupported_tokenizer(tmp_path: Path, tiny_bert_dir: Path) -> None:
    # Found by the gateway (in serve's own process) once the replica is up: the replica
    # is stopped, and the line names the file.
    for name in ("config.json", "model.safetensors"):
        shutil.copy(tiny_bert_dir / name, tmp_path / name)
    (tmp_path / "tokenizer.json").write_text(json.dumps({"model": {"type": "NoSuchModel"}}))
    assert_error_last(serve("--model", str(tmp_path), "--port", "0"), "tokenizer.json")


def test_a_replica_that_fails_to_start_is_reported_in_its_own_words(tmp_path: Path,
                                                                    tiny_bert_dir: Path) -> None:
    # Weights that only loading finds broken: the replica (a child process) prints its
    # one line and exits 2; serve prints that line as its own, once (the replica's log
    # lines before it pass through).
    for name in ("config.json", "tokenizer.json", "sentencepiece.bpe.model"):
        shutil.copy(tiny_bert_dir / name, tmp_path / name)
    (tmp_path / "model.safetensors").write_bytes(b"not a safetensors file")
    done = serve("--model", str(tmp_path), "--port", "0")
    line = assert_error_last(done, "replica 0: ", "cannot read weights", str(tmp_path))
    assert line.count("embedserve: error:") == 1


def test_a_port_in_use(tiny_bert_dir: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert_one_line(serve("--model", str(tiny_bert_dir), "--port", str(port)),
                        f"port {port}", "already in use", "--port")


@pytest.mark.parametrize(("args", "cause"), [
    (("--replicas", "0"), "--replicas 0"),
    (("--port", "eighty"), "--port"),
    (("--no-such-flag",), "--no-such-flag"),
    (("--served-model-name", "a", "--model", "{model}:name=b"), "--served-model-name"),
    (("--model", "{model}:upstream=127.0.0.1:1"), "upstream="),
])
def test_bad_flags(args: tuple[str, ...], cause: str, tiny_bert_dir: Path) -> None:
    args = tuple(a.format(model=tiny_bert_dir) for a in args)
    assert_one_line(serve(*args), cause)


def test_an_unwritable_cache_directory(tmp_path: Path, tiny_bert_dir: Path) -> None:
    not_a_directory = tmp_path / "a-file"
    not_a_directory.write_text("")
    done = run_cli("serve", "--model", str(tiny_bert_dir), "--port", "0",
                   "--cache-dir", str(not_a_directory / "cache"))
    assert_one_line(done, "cache directory", "not writable", "--cache-dir")


NO_PASSWD_ENTRY = """
import pwd, runpy, sys

def no_entry(uid):
    raise KeyError(f"getpwuid(): uid not found: {uid}")

pwd.getpwuid = no_entry   # as for a uid the image's /etc/passwd does not list
sys.argv = ["embedserve", *sys.argv[1:]]
runpy.run_module("embedserve.cli", run_name="__main__")
"""


def test_no_home_to_keep_the_caches_in() -> None:
    """A container run as an arbitrary uid: no passwd entry and no $HOME, so ``~`` has no
    meaning; the default cache directory is then a one-line error naming both ways out."""
    environ = {name: value for name, value in os.environ.items()
               if name not in ("HOME", "EMBEDSERVE_CACHE_DIR", "EMBEDSERVE_DEBUG")}
    environ.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-c", NO_PASSWD_ENTRY, "serve", "--port", "0"], capture_output=True,
                          text=True, env=environ, cwd=str(ROOT), timeout=120, stdin=subprocess.DEVNULL)
    assert_one_line(done, "no home directory", f"uid {os.getuid()}", "HOME", "EMBEDSERVE_CACHE_DIR")


def test_no_space_left_names_the_caches_to_move() -> None:
    # A full disk cannot be made here without privileges; the translation of the
    # error a write then raises is what every entry point uses.
    message, status = describe(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/cache/x.npz"))
    assert status == 2
    assert "No space left on device" in message and "/cache/x.npz" in message
    assert "--cache-dir" in message and "NUMBA_CACHE_DIR" in message


def test_the_translation_keeps_a_message_that_says_what_to_do() -> None:
    assert describe(StartupError("cause", "fix")) == ("cause; fix", 2)
    assert describe(ModelLoadError("bad; do this")) == ("bad; do this", 2)
    message, status = describe(ModelLoadError("bad"))
    assert status == 2 and message.startswith("bad; give --model")
    message, status = describe(ZeroDivisionError("x"))
    assert status == 1 and "--debug" in message


def test_debug_shows_the_traceback_then_the_line(tmp_path: Path) -> None:
    for debug in (("--debug",), ()):
        env = {} if debug else {"EMBEDSERVE_DEBUG": "1"}
        done = run_cli(*debug, "serve", "--model", str(tmp_path / "missing"), "--port", "0", env=env)
        assert done.returncode == 2
        assert "Traceback" in done.stderr
        assert done.stderr.splitlines()[-1].startswith("embedserve: error: model directory not found")


def test_version() -> None:
    from importlib.metadata import version

    done = run_cli("--version")
    assert done.returncode == 0
    assert done.stdout.strip() == f"embedserve {version('embedserve')}"
