"""A synthetic cross-encoder for the reranking workload, built from the default model.

No real reranker is available offline, so the scoring workload runs on the
default model's encoder (multilingual-e5-small, a BertModel) re-expressed as
an ``XLMRobertaForSequenceClassification`` with a seeded random
classification head (one label). Its scores mean nothing; its cost is that
of a real small XLM-R reranker, and every system loads the same files.

The BERT -> XLM-R mapping keeps the encoder's function: XLM-R numbers
positions from ``pad_token_id + 1`` (= 2), so the 512 BERT position rows move
to rows 2..513 of a 514-row table; XLM-R tokenizers give no segment ids, so
one token-type row (BERT's row 0) is kept. The head is calibrated on fixed
pairs (``_calibrate``) so that sigmoid scores differ clearly between documents.

The output directory is built once (atomically: a temporary sibling renamed
into place) and reused while its stamp matches.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

RERANKER_NAME = "bench-reranker-e5-small"
BUILD_VERSION = 1
HEAD_SEED = 20240607
TOKENIZER_FILES = ("tokenizer.json", "sentencepiece.bpe.model", "tokenizer_config.json",
                   "special_tokens_map.json")
XLMR_PAD_ID = 1
NOTE = """# Synthetic reranker (benchmark only)

Built by `bench/suite/peer_reranker.py` from the default model ({source}):
its BERT encoder weights re-expressed as XLMRobertaForSequenceClassification
plus a classification head drawn at random (numpy seed {seed}, one label).
It has never been trained on relevance: its scores are meaningless and serve
only to measure the cost of reranking with a small XLM-R cross-encoder.
"""


def _xlmr_config(bert: dict) -> dict:
    return {
        "architectures": ["XLMRobertaForSequenceClassification"],
        "model_type": "xlm-roberta",
        "vocab_size": bert["vocab_size"],
        "hidden_size": bert["hidden_size"],
        "num_hidden_layers": bert["num_hidden_layers"],
        "num_attention_heads": bert["num_attention_heads"],
        "intermediate_size": bert["intermediate_size"],
        "hidden_act": bert["hidden_act"],
        "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1,
        "classifier_dropout": None,
        "max_position_embeddings": bert["max_position_embeddings"] + XLMR_PAD_ID + 1,
        "type_vocab_size": 1,
        "initializer_range": 0.02,
        "layer_norm_eps": bert["layer_norm_eps"],
        "pad_token_id": XLMR_PAD_ID,
        "bos_token_id": 0,
        "eos_token_id": 2,
        "position_embedding_type": "absolute",
        "id2label": {"0": "LABEL_0"},
        "label2id": {"LABEL_0": 0},
        "torch_dtype": "float32",
    }


def _xlmr_weights(bert: dict[str, np.ndarray], hidden: int) -> dict[str, np.ndarray]:
    out = {f"roberta.{k}": v for k, v in bert.items()
           if not k.startswith("pooler.") and not k.endswith("position_ids")
           and k not in ("embeddings.position_embeddings.weight", "embeddings.token_type_embeddings.weight")}
    positions = bert["embeddings.position_embeddings.weight"]                 # [512, hidden]
    offset = XLMR_PAD_ID + 1
    table = np.zeros((positions.shape[0] + offset, hidden), dtype=np.float32)  # [514, hidden]
    table[offset:] = positions
    out["roberta.embeddings.position_embeddings.weight"] = table
    out["roberta.embeddings.token_type_embeddings.weight"] = \
        np.ascontiguousarray(bert["embeddings.token_type_embeddings.weight"][:1])
    # Head: dense -> tanh -> out_proj on the <s> state, random; _calibrate
    # then scales and shifts out_proj so that logits spread over a few units.
    rng = np.random.default_rng(HEAD_SEED)
    out["classifier.dense.weight"] = rng.normal(0.0, 1.0 / np.sqrt(hidden), (hidden, hidden)).astype(np.float32)
    out["classifier.dense.bias"] = np.zeros(hidden, dtype=np.float32)
    out["classifier.out_proj.weight"] = rng.normal(0.0, 1.0 / np.sqrt(hidden), (1, hidden)).astype(np.float32)
    out["classifier.out_proj.bias"] = np.zeros(1, dtype=np.float32)
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in out.items()}


# Fixed query/document pairs (relevant and not, several languages) on which
# the head is calibrated; they only set the logits' offset and scale.
CALIBRATION_PAIRS = (
    ("how much protein should a woman eat",
     "The average protein requirement for women aged 19 to 70 is 46 grams per day."),
    ("how much protein should a woman eat", "Summit: the highest point of a mountain."),
    ("capital of Germany", "Berlin is the capital and largest city of Germany."),
    ("capital of Germany", "The sky appears blue because of Rayleigh scattering."),
    ("¿cuál es la capital de Francia?", "París es la capital de Francia."),
    ("¿cuál es la capital de Francia?", "El fútbol es el deporte más popular del mundo."),
    ("wie funktioniert eine Wärmepumpe", "Eine Wärmepumpe nutzt Umgebungswärme und hebt sie mit einem Verdichter an."),
    ("wie funktioniert eine Wärmepumpe", "Der Rhein fließt durch sechs Länder."),
    ("python list comprehension", "A list comprehension builds a list from an iterable in one expression."),
    ("python list comprehension", "Pythons are large constricting snakes found in Africa and Asia."),
    ("symptoms of flu", "Influenza causes fever, cough, sore throat and muscle aches."),
    ("symptoms of flu", "The stock market closed higher on Friday."),
)
TARGET_LOGIT_STD = 2.0


def _calibrate(model_dir: Path, weights: dict[str, np.ndarray]) -> None:
    """Scale and shift out_proj so calibration logits have mean 0 and std TARGET_LOGIT_STD.

    A random head on an encoder trained for mean pooling sees <s> states
    that differ little between inputs, so raw logits sit within ~0.1 of each
    other; rescaled, sigmoid scores spread over (0, 1) and a score mix-up
    between systems cannot hide inside a narrow band.
    """
    import torch
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    model = transformers.XLMRobertaForSequenceClassification.from_pretrained(str(model_dir)).eval()
    features = tokenizer([q for q, _ in CALIBRATION_PAIRS], [d for _, d in CALIBRATION_PAIRS],
                         padding=True, return_tensors="pt")
    with torch.inference_mode():
        # out_proj's bias is 0 here, so logits are linear in its weight.
        logits = model(**features).logits[:, 0].double().numpy()                        # [N]
    scale = TARGET_LOGIT_STD / float(logits.std())
    weights["classifier.out_proj.weight"] = (weights["classifier.out_proj.weight"] * scale).astype(np.float32)
    weights["classifier.out_proj.bias"] = np.array([-float(logits.mean()) * scale], dtype=np.float32)


def _stamp(default_model_dir: Path) -> dict:
    source = json.loads((default_model_dir / "embedserve_build.json").read_text()) \
        if (default_model_dir / "embedserve_build.json").exists() else {}
    return {"build_version": BUILD_VERSION, "head_seed": HEAD_SEED,
            "source": str(default_model_dir), "source_sha256": source.get("source_sha256")}


def build_bench_reranker(default_model_dir: Path, out_dir: Path) -> Path:
    """The synthetic reranker's directory (``out_dir/bench-reranker-e5-small``), built on first use."""
    default_model_dir = Path(default_model_dir)
    target = Path(out_dir) / RERANKER_NAME
    stamp = _stamp(default_model_dir)
    stamp_path = target / "embedserve_build.json"
    if stamp_path.exists() and json.loads(stamp_path.read_text()) == stamp:
        return target
    bert_config = json.loads((default_model_dir / "config.json").read_text())
    if bert_config.get("model_type") != "bert":
        raise ValueError(f"{default_model_dir} is not a BERT encoder (model_type "
                         f"{bert_config.get('model_type')!r}); the reranker is built from the default model")
    weights = _xlmr_weights(load_file(str(default_model_dir / "model.safetensors")), bert_config["hidden_size"])
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{RERANKER_NAME}-", dir=target.parent))
    try:
        (staging / "config.json").write_text(json.dumps(_xlmr_config(bert_config), indent=2))
        for name in TOKENIZER_FILES:
            if (default_model_dir / name).exists():
                shutil.copy(default_model_dir / name, staging / name)
        save_file(weights, str(staging / "model.safetensors"), metadata={"format": "pt"})
        _calibrate(staging, weights)
        save_file(weights, str(staging / "model.safetensors"), metadata={"format": "pt"})
        (staging / "SYNTHETIC_RERANKER.md").write_text(NOTE.format(source=default_model_dir, seed=HEAD_SEED))
        (staging / "embedserve_build.json").write_text(json.dumps(stamp, indent=2))
        if target.exists():
            shutil.rmtree(target)
        try:
            staging.rename(target)
        except OSError:
            # A concurrent builder renamed its (identical) copy into place first.
            if not (stamp_path.exists() and json.loads(stamp_path.read_text()) == stamp):
                raise
            shutil.rmtree(staging, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target
