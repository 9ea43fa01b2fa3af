"""``embedserve embed``'s own failures: one line that names the cause and the flag to use.

A job in which no row could be embedded fails (not an empty output and
status 0); two runs writing one output are refused by a lock, not left to
collide; against a gateway serving several models, the job names the one to
use (``--served-model``) and reads the API key from ``EMBEDSERVE_API_KEY``.
Real processes and a real ``embedserve serve``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bulk_corpus import documents, write_jsonl
from embedserve.bulk.job_lock import output_lock
from serve_harness import served
from test_bulk_embed import embed, read_output

ROOT = Path(__file__).resolve().parents[1]


def embed_process(*argv: object, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "embedserve.cli", "embed", *map(str, argv),
                           "--no-progress", "--dtype", "float32"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
                               **(env or {})}, timeout=300)


def test_a_job_that_embeds_no_row_fails_naming_the_fields_it_saw(tmp_path: Path, tiny_bert_dir: Path) -> None:
    source = tmp_path / "docs.jsonl"
    source.write_text("".join(json.dumps({"id": i, "body": text, "title": "t"}) + "\n"
                              for i, text in enumerate(documents(12))))
    output = tmp_path / "out.parquet"
    done = embed_process(source, "-o", output, "--model", tiny_bert_dir)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [done.stderr.strip()], done.stderr   # one line
    line = done.stderr.strip()
    assert line.startswith("embedserve: error: none of the 12 rows has the field 'text'")
    assert "id, body, title" in line and "--text-field" in line
    assert not output.exists()                                   # no empty output to refuse a rerun
    assert len((tmp_path / "out.parquet.errors.jsonl").read_text().splitlines()) == 12
    # The fix the line names works, without --overwrite.
    assert embed(source, "-o", output, "--model", tiny_bert_dir, "--text-field", "body") == 0
    assert len(read_output(output)[0]) == 12


def test_a_second_run_on_one_output_is_refused_naming_the_first(tmp_path: Path, tiny_bert_dir: Path) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", documents(5))
    output = tmp_path / "out.parquet"
    with output_lock(output.with_name("out.parquet.lock")):    # a run holding it, as this process
        done = embed_process(source, "-o", output, "--model", tiny_bert_dir)
    assert done.returncode == 2, done.stderr
    line = done.stderr.strip()
    assert "\n" not in line and line.startswith("embedserve: error: ")
    assert f"pid {os.getpid()}" in line and "another embedserve embed run" in line
    assert not output.exists() and not output.with_name("out.parquet.parts").exists()


def test_a_crashed_runs_lock_is_not_stale(tmp_path: Path) -> None:
    lock = tmp_path / "out.parquet.lock"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\n"
                               "from pathlib import Path\n"
                               "from embedserve.bulk.job_lock import output_lock\n"
                               f"with output_lock(Path({str(lock)!r})):\n"
                               "    print('held', flush=True); time.sleep(600)"],
                              stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(Exception, match=f"pid {holder.pid}"):
            with output_lock(lock):
                pass
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert lock.exists()               # left behind by the crash, and yet:
    with output_lock(lock):
        pass
    assert not lock.exists()


@pytest.fixture(scope="module")
def two_model_gateway(default_model_dir: Path, tiny_reranker_dir: Path):
    with served("--model", f"{default_model_dir}:name=e5", "--model", f"{tiny_reranker_dir}:name=rr",
                "--api-key", "sesame") as url:
        yield url


def test_url_against_two_models_names_them_and_takes_the_key_from_the_environment(
        tmp_path: Path, default_model_dir: Path, two_model_gateway: str, monkeypatch, capsys) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", documents(20))
    common = ("--url", two_model_gateway, "--model", default_model_dir)
    assert embed(source, "-o", tmp_path / "a.parquet", *common) == 2
    assert "EMBEDSERVE_API_KEY" in capsys.readouterr().err     # 401: where the key goes
    monkeypatch.setenv("EMBEDSERVE_API_KEY", "sesame")
    assert embed(source, "-o", tmp_path / "a.parquet", *common) == 2
    line = capsys.readouterr().err.strip()
    assert "serves several models: e5 (embedding), rr (reranker)" in line
    assert "--served-model" in line
    assert embed(source, "-o", tmp_path / "a.parquet", *common, "--served-model", "rr") == 2
    assert "a reranker model" in capsys.readouterr().err
    assert embed(source, "-o", tmp_path / "a.parquet", *common, "--served-model", "e5") == 0
    ids, vectors, _ = read_output(tmp_path / "a.parquet")
    assert ids == list(range(20)) and vectors.shape == (20, 384)
