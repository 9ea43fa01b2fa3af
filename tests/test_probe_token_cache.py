"""The dtype probe's and calibration's token ids: `tokenizers`' ids, loaded once per tokenizer.

A real tiny model with the XLM-R tokenizer files; ids are compared with the
`tokenizers` library reading the same tokenizer.json. Whether a start loads a
tokenizer is seen in a fresh process: `tokenizers` in its sys.modules or not.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
import tokenizers

from embedserve.model.calibration_texts import CALIBRATION_TEXTS
from embedserve.model.info import read_model_info
from embedserve.model.probe_texts import PROBE_TEXTS
from embedserve.scheduler.engine_loading import probe_tokens
from embedserve.scheduler.probe_token_cache import cache_key

ROOT = Path(__file__).resolve().parents[1]


def reference_ids(model_dir: Path, *samples: Sequence[str]) -> list[list[list[int]]]:
    """Each sample's ids from `tokenizers` (one load of the ~0.6 s file for all of them)."""
    tokenizer = tokenizers.Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(read_model_info(model_dir).max_positions)
    return [[encoding.ids for encoding in tokenizer.encode_batch(list(texts))] for texts in samples]


def as_lists(batch) -> list[list[int]]:  # noqa: ANN001 (a RaggedBatch)
    return [batch.sequence(i).tolist() for i in range(batch.num_sequences)]


@pytest.fixture
def model_dir(tiny_bert_dir: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(tiny_bert_dir, tmp_path / "model"))


def test_a_later_process_gets_the_same_ids_without_loading_a_tokenizer(model_dir: Path, tmp_path: Path):
    script = ("import json, sys\n"
              "from pathlib import Path\n"
              "from embedserve.scheduler.engine_loading import probe_tokens\n"
              f"batch = probe_tokens(Path({str(model_dir)!r}))\n"
              "print(json.dumps({'ids': batch.token_ids.tolist(), 'cu': batch.cu_seqlens.tolist(),\n"
              "                  'loaded': 'tokenizers' in sys.modules}))\n")
    env = dict(os.environ, HOME=str(tmp_path / "home"), PYTHONPATH=str(ROOT))  # ~/.cache: the test's own
    runs = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
        runs.append(json.loads(done.stdout.splitlines()[-1]))
    first, second = runs
    assert first["loaded"] and not second["loaded"]
    assert (second["ids"], second["cu"]) == (first["ids"], first["cu"])
    [expected] = reference_ids(model_dir, PROBE_TEXTS)
    assert [first["ids"][a:b] for a, b in zip(first["cu"], first["cu"][1:])] == expected
    assert max(map(len, expected)) > 20  # real text, not a stub
    assert len(list((tmp_path / "home" / ".cache" / "embedserve" / "probe-tokens").glob("probe-*.npz"))) == 1


def test_calibration_texts_are_kept_apart_from_the_probes(model_dir: Path, tmp_path: Path):
    cache = tmp_path / "cache"
    probe = probe_tokens(model_dir, cache_dir=cache)
    calibration = probe_tokens(model_dir, CALIBRATION_TEXTS, cache_dir=cache)
    assert len(list(cache.glob("probe-*.npz"))) == 2
    references = reference_ids(model_dir, PROBE_TEXTS, CALIBRATION_TEXTS)
    for texts, batch, expected in zip((PROBE_TEXTS, CALIBRATION_TEXTS), (probe, calibration), references):
        again = probe_tokens(model_dir, texts, cache_dir=cache)
        assert as_lists(again) == as_lists(batch) == expected
        assert again.token_ids.dtype == again.cu_seqlens.dtype == np.int32


def test_an_edited_tokenizer_or_length_gets_new_ids(model_dir: Path, tmp_path: Path):
    cache = tmp_path / "cache"
    before = as_lists(probe_tokens(model_dir, cache_dir=cache))
    doc = json.loads((model_dir / "tokenizer.json").read_text())
    doc["normalizer"] = {"type": "Sequence", "normalizers": [doc["normalizer"], {"type": "Lowercase"}]}
    (model_dir / "tokenizer.json").write_text(json.dumps(doc))
    lowered = as_lists(probe_tokens(model_dir, cache_dir=cache))
    assert lowered != before and [lowered] == reference_ids(model_dir, PROBE_TEXTS)
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 10}))
    short = as_lists(probe_tokens(model_dir, cache_dir=cache))
    assert max(map(len, short)) == read_model_info(model_dir).max_positions < max(map(len, lowered))
    assert [short] == reference_ids(model_dir, PROBE_TEXTS)
    assert len(list(cache.glob("probe-*.npz"))) == 3


@pytest.mark.parametrize("content", ["garbage", "wrong shape"])
def test_a_corrupt_entry_is_recomputed_and_replaced(model_dir: Path, tmp_path: Path, content: str):
    cache = tmp_path / "cache"
    cache.mkdir()
    path = cache / f"probe-{cache_key(model_dir, PROBE_TEXTS, read_model_info(model_dir).max_positions)}.npz"
    if content == "garbage":
        path.write_bytes(b"PK\x03\x04 not a zip")
    else:
        np.savez(path, token_ids=np.arange(5, dtype=np.int32), cu_seqlens=np.array([0, 5], np.int32))
    [expected] = reference_ids(model_dir, PROBE_TEXTS)
    assert as_lists(probe_tokens(model_dir, cache_dir=cache)) == expected
    with np.load(path) as stored:  # replaced by the right ids
        cu = stored["cu_seqlens"].tolist()
        assert [stored["token_ids"][a:b].tolist() for a, b in zip(cu, cu[1:])] == expected


def test_an_unwritable_cache_still_gives_the_ids(model_dir: Path, tmp_path: Path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    [expected] = reference_ids(model_dir, PROBE_TEXTS)
    # mkdir under a file fails; "~user" of no such user cannot be expanded (as "~" where a
    # container's uid has no passwd entry and no $HOME); None: no cache
    for cache_dir in (blocker / "cache", Path("~no-such-user-embedserve/cache"), None):
        assert as_lists(probe_tokens(model_dir, cache_dir=cache_dir)) == expected
