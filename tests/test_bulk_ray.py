"""``embedserve embed --ray`` and ``integrations.ray.EmbedBatches`` on a local Ray cluster.

One short Ray session (2 CPUs, a tiny random BERT, a few hundred documents:
Ray is expensive to start). The Ray job's output file, errors file included,
is byte for byte the single-process run's (with ``--long-inputs chunk``
too); ``EmbedBatches`` used directly in ``map_batches`` gives the same
vectors and passes bad rows through with a reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bulk_corpus import documents, write_jsonl
from embedserve.bulk.ray_job import (
    GCS_START_WAIT_VARIABLE,
    LOCAL_GCS_START_WAIT_S,
    LOCAL_START_ATTEMPTS,
    child_pids,
    cpus_per_actor_for,
    environment_default,
    local_cpus,
    start_local_ray,
)
from embedserve.cli import main
from embedserve.local.columns import embedding_matrix

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def local_ray():
    # As `--ray local` starts it for one actor of 2 CPUs (the chunking test's).
    start_local_ray(1, 2)
    yield
    ray.shutdown()


def test_ray_job_writes_the_single_process_bytes(tmp_path, tiny_bert_dir, local_ray):
    texts = documents(300)
    source = tmp_path / "in.jsonl"
    write_jsonl(source, texts, [f"d{i}" for i in range(300)])
    with open(source, "a") as f:  # bad rows: the same reasons, the same places
        f.write('{"id": "x1"}\nnot json\n{"id": "x2", "text": ""}\n')
        f.write(json.dumps({"id": "x3", "text": " ".join(texts)}) + "\n")  # too long: refused
    common = ["--model", str(tiny_bert_dir), "--id-field", "id", "--part-size", "64", "--no-progress"]
    assert main(["embed", str(source), "-o", str(tmp_path / "single.parquet"), *common]) == 0
    assert main(["embed", str(source), "-o", str(tmp_path / "ray.parquet"), "--ray", "local",
                 "--ray-actors", "1", *common]) == 0
    assert (tmp_path / "ray.parquet").read_bytes() == (tmp_path / "single.parquet").read_bytes()
    errors = (tmp_path / "ray.parquet.errors.jsonl").read_text()
    assert errors == (tmp_path / "single.parquet.errors.jsonl").read_text()
    assert [json.loads(line)["row"] for line in errors.splitlines()] == [300, 301, 302, 303]

    # The integration on its own, in a pipeline the user writes.
    from embedserve.integrations.ray import EmbedBatches

    ray.data.DataContext.get_current().execution_options.preserve_order = True
    dataset = ray.data.from_items([{"text": t} for t in texts[:64]] + [{"text": ""}])
    mapped = dataset.map_batches(EmbedBatches, fn_constructor_kwargs={"model_dir": str(tiny_bert_dir)},
                                 concurrency=1, batch_size=65, batch_format="pyarrow")
    table = pa.concat_tables(ray.get(mapped.to_arrow_refs()))
    assert table.column("problem").to_pylist() == [None] * 64 + ["empty text"]
    assert table.column("embedding").null_count == 1
    single = embedding_matrix(pq.read_table(tmp_path / "single.parquet").column("embedding"), "float32")
    got = embedding_matrix(table.column("embedding").slice(0, 64), "float32")
    np.testing.assert_allclose(got, single[:64], rtol=0, atol=1e-6)


def test_an_interrupted_ray_job_resumes_from_its_manifest(tmp_path, tiny_bert_dir, local_ray,
                                                          monkeypatch, capsys):
    from embedserve.bulk import ray_job

    source = write_jsonl(tmp_path / "in.jsonl", documents(200))
    common = ["--model", str(tiny_bert_dir), "--part-size", "64", "--no-progress"]
    assert main(["embed", str(source), "-o", str(tmp_path / "single.parquet"), *common]) == 0
    written = []
    real_write_part = ray_job.write_part

    def write_two_then_fail(paths, index, *rest):
        if len(written) == 2:
            raise RuntimeError("interrupted")
        written.append(index)
        real_write_part(paths, index, *rest)

    monkeypatch.setattr(ray_job, "write_part", write_two_then_fail)
    ray_command = ["embed", str(source), "-o", str(tmp_path / "ray.parquet"), "--ray", "local", *common]
    assert main(ray_command) == 1 and written == [0, 1]
    monkeypatch.setattr(ray_job, "write_part", real_write_part)
    capsys.readouterr()
    assert main(ray_command) == 0
    summary = capsys.readouterr().err
    assert "embedded 200 documents" in summary and "128 rows were already done" in summary
    assert (tmp_path / "ray.parquet").read_bytes() == (tmp_path / "single.parquet").read_bytes()


def test_ray_job_chunks_long_documents_like_the_single_process_run(tmp_path, tiny_bert_dir, local_ray):
    texts = documents(40)
    for i in (3, 17, 30):   # thousands of tokens: several windows of the model's 512
        texts[i] = " ".join(documents(60 + i))
    source = write_jsonl(tmp_path / "in.jsonl", texts)
    common = ["--model", str(tiny_bert_dir), "--part-size", "16", "--long-inputs", "chunk",
              "--chunk-overlap", "16", "--no-progress"]
    assert main(["embed", str(source), "-o", str(tmp_path / "single.parquet"), *common]) == 0
    # An actor holding 2 CPUs: Ray Data's read tasks still get the one local_cpus leaves them.
    assert main(["embed", str(source), "-o", str(tmp_path / "ray.parquet"), "--ray", "local",
                 "--ray-actors", "1", "--ray-cpus-per-actor", "2", *common]) == 0
    assert (tmp_path / "ray.parquet").read_bytes() == (tmp_path / "single.parquet").read_bytes()
    table = pq.read_table(tmp_path / "ray.parquet")
    assert [i for i, c in enumerate(table.column("chunked").to_pylist()) if c] == [3, 17, 30]
    assert (tmp_path / "ray.parquet.errors.jsonl").read_text() == ""


def test_a_local_clusters_workers_run_at_the_drivers_priority(local_ray):
    # Ray's default (nice 15) lets every daemon wake-up preempt the model's threads.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import tests
    assert ray.get(ray.remote(num_cpus=1)(_niceness).remote()) == _niceness()


def _niceness() -> int:
    return os.nice(0)


def test_a_local_cluster_leaves_a_cpu_beside_the_actors(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    assert local_cpus(1, 1) == 2        # the machine's cores when the actors leave one free
    assert local_cpus(1, 2) == 3        # one actor on every core: one more for reading
    assert local_cpus(2, 1.5) == 4


def test_actors_share_the_cores_of_a_local_ray_unless_told(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 8)
    assert cpus_per_actor_for("local", 1, None) == 8
    assert cpus_per_actor_for("local", 3, None) == 2
    assert cpus_per_actor_for("local", 16, None) == 1
    assert cpus_per_actor_for("auto", 1, None) == 1     # a cluster's nodes are not this machine
    assert cpus_per_actor_for("local", 1, 0.5) == 0.5


def test_a_local_head_waits_longer_for_its_gcs_unless_the_user_chose(monkeypatch):
    # Ray fails ray.init when its GCS has not published a port in 30 s; a busy machine
    # once took longer. The longer wait lasts only while the head starts.
    monkeypatch.delenv(GCS_START_WAIT_VARIABLE, raising=False)
    with environment_default(GCS_START_WAIT_VARIABLE, str(LOCAL_GCS_START_WAIT_S)):
        assert int(os.environ[GCS_START_WAIT_VARIABLE]) > 30
    assert GCS_START_WAIT_VARIABLE not in os.environ

    monkeypatch.setenv(GCS_START_WAIT_VARIABLE, "7")
    with environment_default(GCS_START_WAIT_VARIABLE, str(LOCAL_GCS_START_WAIT_S)):
        assert os.environ[GCS_START_WAIT_VARIABLE] == "7"
    assert os.environ[GCS_START_WAIT_VARIABLE] == "7"


def test_a_local_head_that_does_not_come_up_is_stopped_and_started_again(monkeypatch):
    # Ray's raylet has 30 s to register, with no setting; a timeout cannot be staged for
    # real, so ray.init fails here as Ray's does (a bare Exception), after starting a
    # process it then holds no handle on, as a failed head start leaves its GCS behind.
    calls: list[tuple[str, dict]] = []
    started: list[subprocess.Popen] = []

    def init(**kwargs) -> None:
        calls.append(("init", kwargs))
        started.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]))
        if len(calls) < 2 or fail_always:
            raise Exception("The current node timed out during startup.")

    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray, "shutdown", lambda: calls.append(("shutdown", {})))
    try:
        fail_always = False
        start_local_ray(1, 2)
        assert [name for name, _ in calls] == ["init", "shutdown", "init"]
        assert calls[0][1] == calls[2][1] and calls[0][1]["num_cpus"] == local_cpus(1, 2)
        # The failed start's process is killed and reaped; the head that came up, left alone.
        assert started[0].pid not in child_pids() and started[1].pid in child_pids()

        calls.clear()
        fail_always = True
        with pytest.raises(Exception, match="timed out during startup"):
            start_local_ray(1, 2)
        assert [name for name, _ in calls] == ["init", "shutdown"] * LOCAL_START_ATTEMPTS
        assert not {process.pid for process in started[2:]} & child_pids()
    finally:
        for process in started:
            process.kill()
            process.wait()
