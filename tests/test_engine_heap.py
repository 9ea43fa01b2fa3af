"""engine/heap.py: a CPU engine's process reuses freed step memory instead of faulting it in
anew, unless the environment tunes malloc itself.

Each case runs in a fresh interpreter: the setting is the process's C heap's, and the
measure is the page faults of allocating, filling and freeing a 64 MB tensor five times,
after sixteen such rounds (16,384 pages each: glibc maps such a block afresh on every
allocation by default). Kept, the heap settles within those sixteen: torch allocates with
posix_memalign, which asks for a little more than the block, and small allocations land
between the blocks, so a freed block is too short for the next one until freed
neighbours have joined it; in 32 fresh processes the heap grew by a block on at most 8
of the first 9 rounds and never after.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from embedserve.engine.heap import user_tuned

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")

PAGES = 64 * 1024 * 1024 // 4096
REUSE_CODE = """
import json, resource, sys, torch
from embedserve.engine import heap
setup = sys.argv[1]
if setup == "keep":
    kept = heap.keep_freed_blocks()
elif setup == "engine":
    from embedserve.engine import Engine
    Engine.load(sys.argv[2], dtype="float32").close()
    kept = None
else:
    kept = None
def fill():
    block = torch.empty(16 * 1024 * 1024, dtype=torch.float32)
    block.fill_(1.0)
    del block
for _ in range(16):   # the heap settles (see the module's docstring)
    fill()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    fill()
print(json.dumps({"kept": kept, "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before}))
"""


def reuse(setup: str, *args: str, environment: dict[str, str] | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    env.update(environment or {}, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    done = subprocess.run([sys.executable, "-c", REUSE_CODE, setup, *args], env=env, capture_output=True,
                          text=True, timeout=120, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_glibc_by_default_faults_every_large_block_in_again() -> None:
    assert reuse("none")["faults"] >= 5 * PAGES * 0.9


def test_kept_blocks_are_reused_without_faults() -> None:
    result = reuse("keep")
    assert result["kept"] is True
    assert result["faults"] < PAGES / 4


def test_a_cpu_engine_keeps_its_freed_blocks(tiny_bert_dir: Path) -> None:
    assert reuse("engine", str(tiny_bert_dir))["faults"] < PAGES / 4


def test_the_environments_malloc_tuning_wins() -> None:
    result = reuse("keep", environment={"GLIBC_TUNABLES": "glibc.malloc.perturb=0"})
    assert result["kept"] is False
    assert result["faults"] >= 5 * PAGES * 0.9


@pytest.mark.parametrize(("environment", "tuned"), [
    ({}, False),
    ({"MALLOC_ARENA_MAX": "2", "GLIBC_TUNABLES": "glibc.rtld.nns=2"}, False),
    ({"MALLOC_TRIM_THRESHOLD_": "131072"}, True),
    ({"MALLOC_MMAP_MAX_": "0"}, True),
    ({"GLIBC_TUNABLES": "glibc.rtld.nns=2:glibc.malloc.mmap_threshold=65536"}, True),
])
def test_user_tuned_reads_mallocs_tunables(environment: dict[str, str], tuned: bool) -> None:
    assert user_tuned(environment) is tuned
