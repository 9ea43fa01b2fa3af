"""The architecture holds: layer contracts (.importlinter) and a gateway that loads no torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import ROOT
from embedserve.entrypoint import GATEWAY_LISTENING
from embedserve.launch.processes import free_port


def test_import_contracts_hold() -> None:
    lint_imports = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(lint_imports), "--no-cache"], cwd=ROOT, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_gateway_process_maps_no_torch(default_model_dir: Path) -> None:
    # A real `embedserve gateway` process, as deployments start it; its replica need not
    # exist for start-up. A library mapped into the process is what costs memory, so the
    # check reads the process's own memory map rather than an import list.
    argv = [sys.executable, "-m", "embedserve.cli", "gateway", "--model", str(default_model_dir),
            "--upstream", f"127.0.0.1:{free_port()}", "--port", "0", "--replica-ping", "0"]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        for line in process.stdout:
            lines.append(line)
            if GATEWAY_LISTENING.search(line):
                break
        else:
            raise AssertionError("the gateway exited before listening:\n" + "".join(lines))
        maps = Path(f"/proc/{process.pid}/maps").read_text()
        assert "libtorch" not in maps
        modules = subprocess.run(
            [sys.executable, "-c", "import sys, embedserve.gateway.app, embedserve.gateway.cli, "
             "embedserve.launch.serve; print(sorted(m for m in sys.modules if m.split('.')[0] in "
             "('torch', 'transformers', 'embedserve') and (m.startswith('embedserve.engine') "
             "or not m.startswith('embedserve'))))"],
            capture_output=True, text=True, check=True, cwd=ROOT)
        assert modules.stdout.strip() == "[]"
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_replica_process_maps_no_numba(default_replica) -> None:
    # A replica never tokenizes (ids arrive over gRPC; --dtype auto's probe reads a
    # tokenizer.json with `tokenizers`), so Numba and LLVM (~0.5 s and ~100 MB) stay out:
    # the CLI builds every subcommand's parser in every process, and `embedserve
    # tokenize` imports the tokenizer only when it runs.
    maps = Path(f"/proc/{default_replica.process.pid}/maps").read_text()
    assert "/numba/" not in maps and "llvmlite" not in maps
