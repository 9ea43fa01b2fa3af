"""A bulk job's identity and its files.

``job_parameters`` is everything that decides the output bytes (the input
files with their sizes and times, the model, the embedding options, the part
size, the engine's device and dtype, the output format): the manifest
records it and a rerun must match it. ``JobPaths`` names every file the job
writes, all derived from ``OUTPUT``.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from embedserve.bulk.reader import InputSpec
from embedserve.errors import ModelLoadError
from embedserve.local.options import EmbedOptions

OUTPUT_FORMATS = ("parquet", "npy")


@dataclass(frozen=True)
class JobPaths:
    output: Path
    errors: Path
    format: str

    @property
    def work_dir(self) -> Path:
        return self.output.with_name(self.output.name + ".parts")

    @property
    def lock(self) -> Path:
        """Held by the one run writing this output (``job_lock.py``)."""
        return self.output.with_name(self.output.name + ".lock")

    @property
    def manifest(self) -> Path:
        return self.work_dir / "manifest.json"

    @property
    def ids(self) -> Path:
        """``--format npy``: the ids, one JSON value per line, in the matrix's row order."""
        return self.output.with_name(self.output.stem + ".ids.jsonl")

    def part(self, index: int) -> Path:
        return self.work_dir / f"part-{index:06d}.parquet"

    def part_errors(self, index: int) -> Path:
        return self.work_dir / f"part-{index:06d}.errors.jsonl"


def job_paths(output: Path, errors: Path | None, format: str) -> JobPaths:
    output = output.resolve()
    return JobPaths(output, (errors or output.with_name(output.name + ".errors.jsonl")).resolve(), format)


def model_fingerprint(model_dir: Path) -> str:
    """A digest of the model's config and its weight files' sizes and times."""
    if not model_dir.is_dir():
        raise ModelLoadError(f"model directory not found: {model_dir}")
    digest = hashlib.sha256()
    for path in sorted(model_dir.iterdir()):
        if path.name == "config.json":
            digest.update(path.read_bytes())
        elif path.suffix in (".safetensors", ".bin"):
            stat = path.stat()
            digest.update(f"{path.name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:16]


def job_parameters(spec: InputSpec, model: str, options: EmbedOptions, part_size: int,
                   format: str, engine: dict[str, Any]) -> dict[str, Any]:
    """The recorded identity of a job (JSON-able; compared key by key on resume)."""
    files = [[str(p), p.stat().st_size, p.stat().st_mtime_ns] for p in spec.paths]
    return {"input": {"files": files, "format": spec.format, "text_field": spec.text_field,
                      "id_field": spec.id_field},
            "model": model, "options": asdict(options), "part_size": part_size,
            "format": format, "engine": engine}
