"""Models named by their Hugging Face Hub id (embedserve/defaults/hub.py, hub_cache.py).

A Hub cache laid out by the test as huggingface_hub writes it (tests/hub_layout.py;
checked against the layout the library writes itself when it downloads from a
Hub served by this process) holds all-MiniLM-L6-v2 under its Hub id; with
HF_HUB_OFFLINE=1 a real ``embedserve serve --model ORG/NAME`` serves it under
that name with the vectors of sentence-transformers on the same snapshot.
Nothing here reaches the network.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import openai
import pytest

from embedserve.defaults.hub import ENGINE_FILES, HubModel, engine_files, model_source, resolve_hub_model
from hub_layout import FakeHub, FakeRepo, cache_tree, directory_files, repo_folder, write_snapshot
from serve_harness import ROOT, served

REPO = "sentence-transformers/all-MiniLM-L6-v2"
MAIN = "c9745ed1d9f207416be6d2e6f8de32d1f16199bf"
V1 = "7dbbc90392e2f80f3d3c277d6e90027e55de9125"      # an older commit, tagged v1
UNSUPPORTED = "openai-community/gpt2"
TEXTS = ["Hello, World!", "Crème brûlée is a French dessert.", "中文 and English, mixed.",
         "A longer passage about embeddings, which map text to vectors. " * 6]
MIN_COSINE = 0.99999


def _env(cache: Path, **more: str) -> dict[str, str]:
    """A child's environment: this checkout first, ``cache`` as the Hub cache, no token."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_", "TRANSFORMERS_"))}
    return {**env, "PYTHONPATH": str(ROOT), "HF_HUB_CACHE": str(cache), "HF_HOME": str(cache.parent),
            "HF_HUB_DISABLE_XET": "1", "HF_HUB_DISABLE_TELEMETRY": "1", **more}


def _embedserve(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "embedserve.cli", *args], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=timeout)


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory: pytest.TempPathFactory, minilm_dir: Path) -> Path:
    """MiniLM at main and at the tag v1 (its own modules.json: no Normalize), and a gpt2 config."""
    cache = tmp_path_factory.mktemp("hf-home") / "hub"
    files = directory_files(minilm_dir)
    write_snapshot(cache, REPO, files, MAIN)
    modules = [m for m in json.loads(files["modules.json"]) if not m["type"].endswith("Normalize")]
    write_snapshot(cache, REPO, {**files, "modules.json": json.dumps(modules).encode()}, V1,
                   refs=("v1",))
    config = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}
    write_snapshot(cache, UNSUPPORTED, {"config.json": json.dumps(config).encode()}, "1" * 40)
    return cache


def test_a_local_path_wins_then_the_hub_id_shape(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "org" / "local").mkdir(parents=True)
    assert model_source("org/local") == Path("org/local")            # exists here: a directory
    assert model_source("org/remote") == HubModel("org/remote")
    assert model_source("org/remote@v2.0") == HubModel("org/remote", "v2.0")
    assert model_source("org/remote@refs/pr/1") == HubModel("org/remote", "refs/pr/1")
    for directory in ("./org/remote", "/models/e5", "org/a/b", "e5", "~/m", "../org/remote"):
        assert model_source(directory) == Path(directory), directory


def test_a_download_fetches_only_what_the_engine_reads() -> None:
    repo_files = ["config.json", "model.safetensors", "pytorch_model.bin", "tf_model.h5",
                  "onnx/model.onnx", "openvino/openvino_model.bin", "tokenizer.json",
                  "tokenizer_config.json", "special_tokens_map.json", "vocab.txt",
                  "sentencepiece.bpe.model", "modules.json", "config_sentence_transformers.json",
                  "sentence_bert_config.json", "1_Pooling/config.json", "2_Dense/config.json",
                  "2_Dense/model.safetensors", "README.md", ".gitattributes",
                  "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                  "model.safetensors.index.json", "rust_model.ot", "coreml/model.mlpackage/x.bin"]
    assert sorted(engine_files(repo_files)) == sorted([
        "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
        "special_tokens_map.json", "vocab.txt", "sentencepiece.bpe.model", "modules.json",
        "config_sentence_transformers.json", "sentence_bert_config.json", "1_Pooling/config.json",
        "2_Dense/config.json", "2_Dense/model.safetensors", "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors", "model.safetensors.index.json"])
    assert "config.json" in ENGINE_FILES


def test_a_cached_snapshot_resolves_without_a_download(hub_cache: Path) -> None:
    def no_download(message: str) -> None:
        raise AssertionError(f"a cached snapshot was downloaded: {message}")

    snapshots = repo_folder(hub_cache, REPO) / "snapshots"
    assert resolve_hub_model(HubModel(REPO), hub_cache, no_download) == snapshots / MAIN
    assert resolve_hub_model(HubModel(REPO, "v1"), hub_cache, no_download) == snapshots / V1
    assert resolve_hub_model(HubModel(REPO, V1), hub_cache, no_download) == snapshots / V1


def test_serve_a_hub_id_offline_equals_sentence_transformers(hub_cache: Path) -> None:
    from sentence_transformers import SentenceTransformer

    snapshot = repo_folder(hub_cache, REPO) / "snapshots" / MAIN
    reference = SentenceTransformer(str(snapshot), device="cpu").encode(TEXTS)
    with served("--model", REPO, env={"HF_HUB_CACHE": str(hub_cache), "HF_HUB_OFFLINE": "1",
                                      "HF_ENDPOINT": "http://127.0.0.1:9"}) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused")
        reply = client.embeddings.create(model=REPO, input=TEXTS)
        listed = [model.id for model in client.models.list()]
    assert reply.model == REPO and listed == [REPO]
    vectors = np.array([item.embedding for item in reply.data])
    norms = np.linalg.norm(vectors, axis=1) * np.linalg.norm(reference, axis=1)
    cosine = (vectors * reference).sum(1) / norms
    assert cosine.min() >= MIN_COSINE, cosine


def test_model_list_says_what_is_cached_and_servable(hub_cache: Path) -> None:
    result = _embedserve("model", "list", env=_env(hub_cache, HF_HUB_OFFLINE="1"))
    assert result.returncode == 0, result.stderr
    header, *rows = result.stdout.splitlines()
    assert header.split() == ["MODEL", "COMMIT", "SIZE", "SERVABLE"]
    table = {row.split()[0]: row for row in rows}
    assert set(table) == {REPO, f"{REPO}@v1", f"{UNSUPPORTED}"}
    assert table[REPO].split()[1] == MAIN[:12] and table[REPO].endswith("yes BertModel")
    assert table[f"{REPO}@v1"].split()[1] == V1[:12]
    assert table[UNSUPPORTED].endswith("no: unsupported architecture 'GPT2LMHeadModel'; supported: "
                                       + table[UNSUPPORTED].split("supported: ")[-1])
    assert "MB" in table[REPO]   # 90 MB of weights, shared by both revisions' snapshots


def test_model_pull_of_a_cached_id_succeeds_offline(hub_cache: Path) -> None:
    result = _embedserve("model", "pull", f"{REPO}@v1", env=_env(hub_cache, HF_HUB_OFFLINE="1"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(repo_folder(hub_cache, REPO) / "snapshots" / V1)
    assert "downloading" not in result.stderr


def test_serve_refuses_an_uncached_id_offline_in_one_line(hub_cache: Path) -> None:
    result = _embedserve("serve", "--port", "0", "--model", "BAAI/bge-small-en-v1.5",
                         env=_env(hub_cache, HF_HUB_OFFLINE="1"))
    expected = (f"BAAI/bge-small-en-v1.5 is not in the Hugging Face cache ({hub_cache}) and "
                "HF_HUB_OFFLINE=1; run `embedserve model pull BAAI/bge-small-en-v1.5` where the "
                "Hub is reachable, or pass a model directory")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"embedserve: error: {expected}"), result.stderr
    assert "Traceback" not in result.stderr
    assert "listening" not in result.stdout + result.stderr   # refused before any replica started


def test_a_resolved_hub_model_reaches_a_child_gateway_under_its_id(tmp_path: Path) -> None:
    # `embedserve cluster` hands each model to its gateway process as --model text.
    from embedserve.defaults.model_args import ModelSpec, parse_model_spec
    from embedserve.launch.commands import models_gateway_command

    spec = ModelSpec(tmp_path, upstream="127.0.0.1:1", hub=HubModel(REPO, "v1"))
    argv = models_gateway_command([spec])
    given = parse_model_spec(argv[argv.index("--model") + 1])
    assert (given.path, given.served_names, given.upstream) == (tmp_path, (REPO,), "127.0.0.1:1")
    named = ModelSpec(tmp_path, names=("minilm",), hub=HubModel(REPO))
    assert parse_model_spec(named.format()).served_names == ("minilm",)


def test_revision_flag_needs_a_hub_id_and_agrees_with_at() -> None:
    from embedserve.cli import build_parser
    from embedserve.defaults.model_args import model_specs_from_args

    parser = build_parser()
    with pytest.raises(SystemExit, match="applies to a --model given as a Hugging Face Hub id"):
        model_specs_from_args(parser.parse_args(["serve", "--model", "/m/e5", "--revision", "v1"]))
    with pytest.raises(SystemExit, match="name two revisions"):
        model_specs_from_args(parser.parse_args(["serve", "--model", "org/m@v1", "--revision", "v2"]))


# -- downloads, from a Hub served by this process ----------------------------------

EXTRA_FILES = {"pytorch_model.bin": b"\0" * 64, "onnx/model.onnx": b"\1" * 64, "README.md": b"# m\n",
               ".gitattributes": b"*.bin filter=lfs\n"}


def test_model_pull_downloads_the_engine_files_as_the_library_lays_them_out(
        tmp_path: Path, minilm_dir: Path) -> None:
    files = directory_files(minilm_dir)
    hub = FakeHub({REPO: FakeRepo(MAIN, {**files, **EXTRA_FILES})})
    cache = tmp_path / "hf" / "hub"
    with hub.running():
        result = _embedserve("model", "pull", REPO, env=_env(cache, HF_ENDPOINT=hub.url))
    assert result.returncode == 0, result.stderr
    snapshot = repo_folder(cache, REPO) / "snapshots" / MAIN
    assert result.stdout.strip() == str(snapshot)
    assert f"downloading {REPO} from the Hugging Face Hub into {cache}" in result.stderr
    # Only the files the engine reads, laid out as tests/hub_layout.py lays them out by hand.
    by_hand = tmp_path / "by-hand"
    write_snapshot(by_hand, REPO, files, MAIN)
    assert sorted(p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file()) \
        == sorted(files)
    assert cache_tree(cache) == cache_tree(by_hand)


def test_hub_failures_are_one_line_naming_cause_and_fix(tmp_path: Path, minilm_dir: Path) -> None:
    files = directory_files(minilm_dir)
    no_safetensors = {k: v for k, v in files.items() if not k.endswith(".safetensors")}
    hub = FakeHub({
        "org/gated": FakeRepo(MAIN, files, error=(403, "GatedRepo")),
        "org/bin-only": FakeRepo(MAIN, {**no_safetensors, "pytorch_model.bin": b"\0" * 64}),
        REPO: FakeRepo(MAIN, files),
    })
    cases = {"gated": "org/gated", "missing": "org/private-or-missing", "revision": f"{REPO}@v9",
             "no-safetensors": "org/bin-only"}
    messages = {}
    with hub.running():
        for case, model in cases.items():
            messages[case] = _pull_error(model, _env(tmp_path / case / "hub", HF_ENDPOINT=hub.url))
    # A port bound and not listening: connections are refused (the Hub unreachable), and no
    # other test's server can take the port meanwhile (once it was closed before the call,
    # a parallel worker's server got it and answered).
    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))
        unreachable = f"http://127.0.0.1:{bound.getsockname()[1]}"
        messages["unreachable"] = _pull_error(REPO, _env(tmp_path / "unreachable" / "hub",
                                                         HF_ENDPOINT=unreachable))
    assert all("\n" not in message for message in messages.values()), messages
    assert messages["gated"].startswith("org/gated is gated on the Hugging Face Hub; accept its terms")
    assert "set HF_TOKEN" in messages["gated"]
    assert messages["missing"].startswith("org/private-or-missing is not on the Hugging Face Hub, "
                                          "or is private and HF_TOKEN is unset")
    assert messages["revision"].startswith(f"{REPO} has no revision 'v9' on the Hugging Face Hub; "
                                           "give a branch, tag or commit it has")
    assert messages["no-safetensors"].startswith("org/bin-only has no safetensors weights "
                                                 "(model.safetensors): embedserve loads safetensors only")
    assert messages["unreachable"].startswith(f"cannot reach the Hugging Face Hub to download {REPO} (")
    assert "check the network" in messages["unreachable"]


def _pull_error(model: str, env: dict[str, str]) -> str:
    """The ModelLoadError message ``pull_hub_model(model)`` raises in a process with ``env``
    (huggingface_hub reads HF_ENDPOINT when it is imported)."""
    script = ("import sys\n"
              "from embedserve.defaults.hub import model_source, pull_hub_model\n"
              "from embedserve.errors import ModelLoadError\n"
              "try:\n"
              "    pull_hub_model(model_source(sys.argv[1]))\n"
              "except ModelLoadError as exc:\n"
              "    print(exc.message)\n"
              "else:\n"
              "    sys.exit('no error')\n")
    result = subprocess.run([sys.executable, "-c", script, model], capture_output=True, text=True,
                            env=env, cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()

