"""``embedserve embed`` survives kill -9: the rerun skips finished parts and writes the same bytes.

The job runs as a real process (the default model, small parts so that it
takes several steps); it is killed with SIGKILL once its manifest records a
finished part and before it ends: the job is run in short slices between
SIGSTOPs and the manifest is read while it is stopped, so the kill lands
mid-run however fast or slow the machine is. A changed parameter is then refused
(before a model loads), and the same command resumes, skipping what was recorded.
The result is compared byte for byte with an uninterrupted run of the same command.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

from bulk_corpus import documents, write_jsonl

ROOT = Path(__file__).resolve().parent.parent
PARTS = 5
PART_SIZE = 8


def command(source: Path, output: Path, model: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "embedserve.cli", "embed", str(source), "-o", str(output),
            "--model", str(model), "--part-size", str(PART_SIZE), "--no-progress",
            "--dtype", "float32", *extra]  # an explicit dtype: no load-time probe in any of the runs


def environment() -> dict[str, str]:
    # The same threads in every run: the vectors are compared bit for bit.
    return dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="2")


def finished_parts(manifest: Path) -> int:
    try:
        return len(json.loads(manifest.read_text())["parts"])
    except (FileNotFoundError, ValueError):
        return 0  # not written yet (it is replaced atomically, never seen half-written)


def test_kill_9_then_resume_is_byte_identical(tmp_path, default_model_dir):
    source = write_jsonl(tmp_path / "in.jsonl", documents(PARTS * PART_SIZE))
    output = tmp_path / "out.parquet"
    manifest = tmp_path / "out.parquet.parts" / "manifest.json"
    process = subprocess.Popen(command(source, output, default_model_dir), env=environment(),
                               stderr=subprocess.PIPE, text=True)
    try:
        while finished_parts(manifest) < 1:
            process.send_signal(signal.SIGCONT)
            time.sleep(0.01)
            process.send_signal(signal.SIGSTOP)
            # Wait until it has really stopped: the manifest is then read with the job frozen.
            _, status = os.waitpid(process.pid, os.WUNTRACED)
            assert os.WIFSTOPPED(status), f"the job ended before a part was recorded: {process.stderr.read()}"
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    done = finished_parts(manifest)
    assert 1 <= done < PARTS and not output.exists(), "the kill must land mid-run"

    # Refused before a model loads: this "model" is an empty directory, which only fails
    # once loading starts, and the answer names every parameter that changed.
    (tmp_path / "not-a-model").mkdir()
    changed = subprocess.run(command(source, output, tmp_path / "not-a-model", "--dimensions", "64"),
                             env=environment(), capture_output=True, text=True)
    assert changed.returncode == 2
    assert "holds a different job (model: was" in changed.stderr and "; options: was" in changed.stderr

    resumed = subprocess.run(command(source, output, default_model_dir), env=environment(),
                             capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert f"{done * PART_SIZE} rows were already done" in resumed.stderr

    uninterrupted = tmp_path / "whole.parquet"
    whole = subprocess.run(command(source, uninterrupted, default_model_dir), env=environment(),
                           capture_output=True, text=True)
    assert whole.returncode == 0, whole.stderr
    a, b = pq.read_table(output), pq.read_table(uninterrupted)
    assert a.num_rows == PARTS * PART_SIZE
    assert a.column("embedding").combine_chunks().values.to_numpy().tobytes() == \
        b.column("embedding").combine_chunks().values.to_numpy().tobytes()
    assert output.read_bytes() == uninterrupted.read_bytes()
