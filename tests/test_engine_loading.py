"""Loading model directories: every weight format, and a clear ModelLoadError otherwise."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from embedserve.engine import Batch, Engine
from embedserve.errors import ModelLoadError
from engine_imports import slow_imports_after_load

SEQUENCES = [np.array([0, 100, 2000, 2], np.int32), np.array([0, 7, 2], np.int32)]


def copy_model(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    return target


def embed(model_dir: Path) -> np.ndarray:
    with Engine.load(model_dir) as engine:
        return engine.step(Batch.from_sequences(SEQUENCES)).wait()


def edit_config(model_dir: Path, **changes: object) -> None:
    path = model_dir / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


def test_sharded_safetensors_load_like_one_file(tiny_bert_dir: Path, tmp_path: Path) -> None:
    model_dir = copy_model(tiny_bert_dir, tmp_path / "sharded")
    tensors = load_file(str(model_dir / "model.safetensors"))
    (model_dir / "model.safetensors").unlink()
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for shard, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, str(model_dir / shard))
    index = {"metadata": {}, "weight_map": {k: shard for shard, keys in shards.items() for k in keys}}
    (model_dir / "model.safetensors.index.json").write_text(json.dumps(index))
    assert np.array_equal(embed(model_dir), embed(tiny_bert_dir))


def test_pytorch_bin_loads_through_weights_only(tiny_bert_dir: Path, tmp_path: Path) -> None:
    model_dir = copy_model(tiny_bert_dir, tmp_path / "bin")
    tensors = load_file(str(model_dir / "model.safetensors"))
    (model_dir / "model.safetensors").unlink()
    # old checkpoints: a "bert." prefix and LayerNorm gamma/beta names
    renamed = {"bert." + k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
               for k, v in tensors.items()}
    torch.save(renamed, model_dir / "pytorch_model.bin")
    assert np.array_equal(embed(model_dir), embed(tiny_bert_dir))


class Payload:
    def __reduce__(self):
        return (print, ("pickled code ran",))


def test_pickled_code_in_a_bin_is_refused(tiny_bert_dir: Path, tmp_path: Path) -> None:
    model_dir = copy_model(tiny_bert_dir, tmp_path / "evil")
    (model_dir / "model.safetensors").unlink()
    torch.save({"x": Payload()}, model_dir / "pytorch_model.bin")
    with pytest.raises(ModelLoadError, match="cannot read weights"):
        Engine.load(model_dir)


@pytest.mark.parametrize("breakage, message", [
    ("no_dir", "model directory not found"),
    ("no_config", "missing file: .*config.json"),
    ("bad_json", "unreadable JSON"),
    ("no_weights", "no weights in"),
    ("gpt2", "unsupported architecture 'GPT2Model'"),
    ("shape", r"weight encoder.layers.0.ffn_in.weight has shape \(64, 32\), the config implies \(128, 32\)"),
    ("missing_weight", "checkpoint lacks 1 weights: encoder.layers.1.ffn_out.bias"),
    ("max_pooling", "unsupported pooling"),
    # Two labels make a classifier (model/tasks.py); one whose logits are no probabilities is refused.
    ("two_labels", "unsupported problem_type 'regression'"),
    ("rotary", "unsupported position_embedding_type"),
])
def test_broken_directories_raise_model_load_error(breakage: str, message: str, tiny_bert_dir: Path,
                                                   tiny_reranker_dir: Path, tmp_path: Path) -> None:
    source = tiny_reranker_dir if breakage == "two_labels" else tiny_bert_dir
    model_dir = copy_model(source, tmp_path / "m")
    if breakage == "no_dir":
        model_dir = tmp_path / "absent"
    elif breakage == "no_config":
        (model_dir / "config.json").unlink()
    elif breakage == "bad_json":
        (model_dir / "config.json").write_text("{not json")
    elif breakage == "no_weights":
        (model_dir / "model.safetensors").unlink()
    elif breakage == "gpt2":
        edit_config(model_dir, architectures=["GPT2Model"])
    elif breakage == "shape":
        edit_config(model_dir, intermediate_size=128)
    elif breakage == "missing_weight":
        tensors = load_file(str(model_dir / "model.safetensors"))
        del tensors["encoder.layer.1.output.dense.bias"]
        save_file(tensors, str(model_dir / "model.safetensors"))
    elif breakage == "max_pooling":
        pooling = model_dir / "1_Pooling" / "config.json"
        pooling.write_text(json.dumps({"pooling_mode_max_tokens": True}))
    elif breakage == "two_labels":
        edit_config(model_dir, id2label={"0": "a", "1": "b"}, problem_type="regression")
    elif breakage == "rotary":
        edit_config(model_dir, position_embedding_type="rotary")
    with pytest.raises(ModelLoadError, match=message):
        Engine.load(model_dir)


@pytest.mark.parametrize("kwargs, message", [({"dtype": "int4"}, "unsupported dtype"),
                                             ({"device": "tpu"}, "unsupported device"),
                                             ({"attention": "magic"}, "unknown attention")])
def test_bad_options_raise_model_load_error(kwargs: dict, message: str, tiny_bert_dir: Path) -> None:
    with pytest.raises(ModelLoadError, match=message):
        Engine.load(tiny_bert_dir, **kwargs)


def test_metadata_is_read(tiny_bert_dir: Path, tiny_xlmr_dir: Path, tiny_reranker_dir: Path) -> None:
    with Engine.load(tiny_bert_dir) as bert, Engine.load(tiny_xlmr_dir) as xlmr, \
            Engine.load(tiny_reranker_dir) as reranker:
        assert (bert.info.pooling, bert.info.normalize, bert.info.prompts["query"]) == ("mean", True, "query: ")
        assert (xlmr.info.pooling, xlmr.info.normalize, xlmr.info.prompts) == ("cls", False, {})
        assert (bert.info.max_positions, xlmr.info.max_positions) == (512, 512)   # XLM-R: 514 - 2
        assert (reranker.info.task, reranker.info.dimension) == ("score", 0)


def test_loading_imports_neither_dynamo_nor_sympy(tiny_bert_dir: Path, tiny_reranker_dir: Path) -> None:
    assert slow_imports_after_load(tiny_bert_dir, tiny_reranker_dir) == set()


def test_a_model_file_emptied_in_place_leaves_a_loaded_engine_as_it_was(tiny_bert_dir: Path, tmp_path: Path) -> None:
    # safetensors hands out views of a mapping of the file: an engine that kept them would
    # die of SIGBUS here (in its own process, so the test sees it as a status).
    model_dir = shutil.copytree(tiny_bert_dir, tmp_path / "model")
    script = (
        "import numpy as np\n"
        "from embedserve.engine import Batch, Engine\n"
        "ids = np.arange(1, 250001, 1249, dtype=np.int32)  # rows from all over the embedding table\n"
        f"with Engine.load({str(model_dir)!r}, dtype='float32') as engine:\n"
        "    step = lambda: np.asarray(engine.step(Batch.from_sequences([ids], task=engine.info.task)).wait())\n"
        "    before = step()\n"
        f"    open({str(model_dir / 'model.safetensors')!r}, 'r+b').truncate(0)\n"
        "    after = step()\n"
        "print(np.array_equal(before, after), before.shape)\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split()[0] == "True", result.stdout
