"""The job manifest: what the job is and which parts are finished, on disk.

One JSON file in the job's work directory, rewritten whole and atomically
(a temporary file, fsync, ``os.replace``) after each finished part, so a
kill at any moment leaves either the old manifest or the new one. A part is
recorded only after its files were renamed into place; a part file without a
record is redone. A rerun compares its parameters with the recorded ones and
refuses to mix two different jobs in one output.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from embedserve.errors import InvalidInput

MANIFEST_VERSION = 1


@dataclass
class PartRecord:
    rows: int          # input rows in the part
    documents: int     # rows embedded (rows minus skipped)
    tokens: int
    skipped: dict[str, int] = field(default_factory=dict)   # reason -> count


@dataclass
class Manifest:
    job: dict[str, Any]
    parts: dict[int, PartRecord] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"version": MANIFEST_VERSION, "job": self.job,
                "parts": {str(k): vars(v) for k, v in sorted(self.parts.items())}}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Manifest:
        if data.get("version") != MANIFEST_VERSION:
            raise InvalidInput(f"manifest version {data.get('version')!r} is not {MANIFEST_VERSION}; "
                               "rerun with --overwrite")
        return cls(data["job"], {int(k): PartRecord(**v) for k, v in data["parts"].items()})


def write_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` so that a crash leaves the old file or the new one."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save(manifest: Manifest, path: Path) -> None:
    write_atomic(path, json.dumps(manifest.to_json(), indent=1, sort_keys=True).encode())


def load(path: Path) -> Manifest | None:
    if not path.exists():
        return None
    return Manifest.from_json(json.loads(path.read_text()))


def check_same_job(recorded: dict[str, Any], current: dict[str, Any], work_dir: Path) -> None:
    """Raise InvalidInput naming every parameter that differs from the recorded job."""
    if recorded == current:
        return
    changed = sorted(k for k in recorded.keys() | current.keys() if recorded.get(k) != current.get(k))
    details = "; ".join(f"{k}: was {recorded.get(k)!r}, now {current.get(k)!r}" for k in changed)
    raise InvalidInput(f"{work_dir} holds a different job ({details}); rerun the same command to "
                       "resume it, or pass --overwrite to start over")
