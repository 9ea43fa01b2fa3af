"""Tiny random checkpoints of the task models (classifiers, SPLADE), written by the tests.

Each builder saves a transformers model with ``save_pretrained`` (safetensors) and,
for SPLADE, the sentence-transformers ``SparseEncoder`` folder files (modules.json,
1_SpladePooling/config.json) as sentence-transformers 5+ writes them. Tokenizer files
come from all-MiniLM-L6-v2 (WordPiece, BERT's 30,522 ids; ``minilm_dir`` fixture).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

MINILM_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")
SIZES = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
             # logits spread well beyond the tolerances
             initializer_range=0.25)


def copy_minilm_tokenizer(minilm_dir: Path, directory: Path) -> None:
    for name in MINILM_TOKENIZER_FILES:
        if (minilm_dir / name).exists():
            shutil.copy(minilm_dir / name, directory / name)


def build_classifier(directory: Path, architecture: str, labels: list[str],
                     problem_type: str | None, tokenizer_dir: Path | None, seed: int = 0,
                     vocab_size: int = 30522) -> Path:
    """A random ``BertForSequenceClassification`` / ``XLMRobertaForSequenceClassification``
    with ``labels`` (id2label) and ``problem_type``; MiniLM's tokenizer when given."""
    import torch
    import transformers

    xlmr = architecture.startswith("XLMRoberta")
    config_class = transformers.XLMRobertaConfig if xlmr else transformers.BertConfig
    config = config_class(vocab_size=vocab_size, max_position_embeddings=514 if xlmr else 512,
                          type_vocab_size=2 if not xlmr else 1, **SIZES,
                          id2label=dict(enumerate(labels)),
                          label2id={name: i for i, name in enumerate(labels)},
                          problem_type=problem_type, pad_token_id=1 if xlmr else 0)
    torch.manual_seed(seed)
    model = getattr(transformers, architecture)(config).eval()
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory, safe_serialization=True)
    if tokenizer_dir is not None:
        copy_minilm_tokenizer(tokenizer_dir, directory)
    return directory


def build_splade(directory: Path, tokenizer_dir: Path, pooling_strategy: str = "max",
                 activation_function: str = "relu", seed: int = 0, bias: float | None = None,
                 architecture: str = "BertForMaskedLM", sparse_encoder_files: bool = True) -> Path:
    """A random ``BertForMaskedLM`` (or ``DistilBertForMaskedLM``) as a SPLADE ``SparseEncoder``
    folder (without its files when not ``sparse_encoder_files``).

    ``bias`` is added to the MLM head's output bias so that most vocabulary entries
    stay at 0, as a trained SPLADE model's do (a random head activates about half);
    default -2 (BERT), -4 (DistilBERT, whose random head spreads wider)."""
    import torch
    import transformers

    torch.manual_seed(seed)
    if architecture == "DistilBertForMaskedLM":
        model = transformers.DistilBertForMaskedLM(transformers.DistilBertConfig(
            vocab_size=30522, max_position_embeddings=512, dim=SIZES["hidden_size"],
            n_layers=SIZES["num_hidden_layers"], n_heads=SIZES["num_attention_heads"],
            hidden_dim=SIZES["intermediate_size"], initializer_range=SIZES["initializer_range"])).eval()
        output_bias = model.vocab_projector.bias
    else:
        config = transformers.BertConfig(vocab_size=30522, max_position_embeddings=512, **SIZES)
        model = transformers.BertForMaskedLM(config).eval()
        output_bias = model.cls.predictions.bias
    with torch.no_grad():
        output_bias += bias if bias is not None else -4.0 if architecture == "DistilBertForMaskedLM" else -2.0
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory, safe_serialization=True)
    copy_minilm_tokenizer(tokenizer_dir, directory)
    if not sparse_encoder_files:
        return directory
    (directory / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.base.modules.transformer.Transformer"},
        {"idx": 1, "name": "1", "path": "1_SpladePooling",
         "type": "sentence_transformers.sparse_encoder.modules.splade_pooling.SpladePooling"}]))
    (directory / "sentence_bert_config.json").write_text(json.dumps(
        {"transformer_task": "fill-mask",
         "modality_config": {"text": {"method": "forward", "method_output_name": "logits"}},
         "module_output_name": "token_embeddings"}))
    (directory / "config_sentence_transformers.json").write_text(json.dumps(
        {"model_type": "SparseEncoder", "prompts": {"query": "", "document": ""},
         "default_prompt_name": None, "similarity_fn_name": None}))
    (directory / "1_SpladePooling").mkdir(exist_ok=True)
    (directory / "1_SpladePooling" / "config.json").write_text(json.dumps(
        {"pooling_strategy": pooling_strategy, "activation_function": activation_function,
         "embedding_dimension": None}))
    return directory


# The markers of the multi-vector test model: prompts prepended as text, as
# MultiVectorEncoder's encode_query / encode_document do.
MULTIVECTOR_PROMPTS = {"query": "[Q] ", "document": "[D] "}


def build_multivector(directory: Path, tokenizer_dir: Path, seed: int = 0, out_features: int = 16,
                      bias: bool = False, query_expansion: dict | None = None) -> Path:
    """A random ``BertModel`` saved by sentence-transformers as a ``MultiVectorEncoder``
    folder: Transformer, a token-level Dense projection (hidden -> ``out_features``), a
    MultiVectorMask with the punctuation skiplist (PyLate's default) and Normalize, with
    ``[Q] `` / ``[D] `` marker prompts; ``query_expansion`` set on the Transformer if given."""
    import string

    import torch
    import transformers
    from sentence_transformers import MultiVectorEncoder
    from sentence_transformers.base.modules import Normalize, Transformer
    from sentence_transformers.base.modules.dense import Dense
    from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask

    backbone = directory.parent / f"{directory.name}-backbone"
    backbone.mkdir(parents=True, exist_ok=True)
    config = transformers.BertConfig(vocab_size=30522, max_position_embeddings=512, **SIZES)
    torch.manual_seed(seed)
    transformers.BertModel(config).eval().save_pretrained(backbone, safe_serialization=True)
    copy_minilm_tokenizer(tokenizer_dir, backbone)
    dense = Dense(in_features=config.hidden_size, out_features=out_features, bias=bias,
                  activation_function=torch.nn.Identity(), module_input_name="token_embeddings")
    with torch.no_grad():   # a spread wide enough that a wrong token shows
        dense.linear.weight.normal_(0.0, 0.5)
    model = MultiVectorEncoder(modules=[Transformer(str(backbone)), dense,
                                        MultiVectorMask(skiplist_words=list(string.punctuation)),
                                        Normalize(module_input_name="token_embeddings")],
                               prompts=dict(MULTIVECTOR_PROMPTS), device="cpu")
    if query_expansion is not None:
        model[0].query_expansion = query_expansion
    model.save(str(directory))
    shutil.rmtree(backbone)
    return directory


def _colbert_backbone(tokenizer_dir: Path, seed: int, markers: tuple[str, str], backbone: Path | None = None):
    """A random BertModel and MiniLM's tokenizer (or the model and tokenizer saved in
    ``backbone``), with ``markers`` added as tokens (and the embeddings resized) where the
    vocabulary lacks them, as PyLate's ColBERT does."""
    import torch
    import transformers

    torch.manual_seed(seed)
    if backbone is not None:
        model = transformers.AutoModel.from_pretrained(backbone).eval()
        tokenizer = transformers.AutoTokenizer.from_pretrained(backbone)
    else:
        model = transformers.BertModel(transformers.BertConfig(vocab_size=30522, max_position_embeddings=512,
                                                               **SIZES)).eval()
        tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
    if tokenizer.add_tokens([m for m in markers if m]):
        model.resize_token_embeddings(len(tokenizer))
    return model, tokenizer


def build_pylate(directory: Path, tokenizer_dir: Path, seed: int = 0, out_features: int = 16,
                 query_prefix: str = "[unused0]", document_prefix: str = "[unused1]", query_length: int = 12,
                 document_length: int = 20, do_query_expansion: bool = True,
                 attend_to_expansion_tokens: bool = False, model_type: str | None = "ColBERT",
                 backbone: Path | None = None) -> Path:
    """A random BERT ColBERT in the folder layout PyLate 1.6.0 saves (``ColBERT.save`` over
    sentence-transformers 5): the backbone at the root, ``modules.json`` with a Transformer
    and ``pylate.models.Dense.Dense`` (1_Dense: hidden -> ``out_features``, no bias), and its
    settings as top-level keys of ``config_sentence_transformers.json`` (a fresh save's
    has no ``model_type``: ``model_type=None``). ``backbone``: a saved encoder and tokenizer
    to start from (a ModernBERT, as GTE-ModernColBERT) instead of a random BERT with MiniLM's
    tokenizer. PyLate itself cannot run beside sentence-transformers 6 (it pins 5.3), hence
    written here."""
    import string

    import torch
    from safetensors.torch import save_file

    model, tokenizer = _colbert_backbone(tokenizer_dir, seed, (query_prefix, document_prefix), backbone)
    hidden = model.config.hidden_size
    tokenizer.pad_token = tokenizer.mask_token          # PyLate pads queries with [MASK]
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)
    (directory / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Dense", "type": "pylate.models.Dense.Dense"}], indent=2))
    (directory / "sentence_bert_config.json").write_text(json.dumps(
        {"max_seq_length": document_length - 1, "do_lower_case": False}))
    (directory / "1_Dense").mkdir(exist_ok=True)
    (directory / "1_Dense" / "config.json").write_text(json.dumps(
        {"in_features": hidden, "out_features": out_features, "bias": False,
         "activation_function": "torch.nn.modules.linear.Identity", "use_residual": False}))
    weight = torch.empty(out_features, hidden).normal_(0.0, 0.5)   # a wrong token shows
    save_file({"linear.weight": weight}, str(directory / "1_Dense" / "model.safetensors"))
    config = {"__version__": {"sentence_transformers": "5.3.0", "pylate": "1.6.0"},
              **({"model_type": model_type} if model_type else {}),
              "prompts": {}, "default_prompt_name": None, "similarity_fn_name": "MaxSim",
              "query_prefix": query_prefix, "document_prefix": document_prefix, "query_length": query_length,
              "document_length": document_length, "attend_to_expansion_tokens": attend_to_expansion_tokens,
              "skiplist_words": list(string.punctuation), "do_query_expansion": do_query_expansion}
    (directory / "config_sentence_transformers.json").write_text(json.dumps(config, indent=2))
    return directory


def build_stanford_colbert(directory: Path, tokenizer_dir: Path, seed: int = 0, dim: int = 16,
                           query_maxlen: int = 12, doc_maxlen: int = 20, attend_to_mask_tokens: bool = False,
                           pickled: bool = False, **metadata) -> Path:
    """A random BERT ColBERT as Stanford-NLP's colbert-ai saves a checkpoint
    (``BaseColBERT.save``): its ``HF_ColBERT`` (a BertPreTrainedModel holding ``bert`` and a
    bias-free ``linear`` hidden -> ``dim``) through ``save_pretrained``, so config.json names
    ``HF_ColBERT`` and model.safetensors holds ``bert.*`` and ``linear.weight``; the
    tokenizer; ``artifact.metadata``, its ColBERTConfig as JSON (``metadata`` overrides).
    ``pickled``: the weights as ``pytorch_model.bin`` instead, as older checkpoints have them."""
    import torch
    import transformers
    from torch import nn

    class HF_ColBERT(transformers.BertPreTrainedModel):  # noqa: N801  # colbert-ai's class name, saved in config.json
        def __init__(self, config) -> None:
            super().__init__(config)
            self.linear = nn.Linear(config.hidden_size, dim, bias=False)
            self.bert = transformers.BertModel(config)
            self.post_init()

    backbone, tokenizer = _colbert_backbone(tokenizer_dir, seed, ())
    model = HF_ColBERT(backbone.config).eval()
    with torch.no_grad():
        model.bert.load_state_dict(backbone.state_dict())
        model.linear.weight.normal_(0.0, 0.5)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    if pickled:   # transformers 5 writes safetensors only; older colbert-ai saves were torch.save'd
        from safetensors.torch import load_file

        torch.save(load_file(str(directory / "model.safetensors")), str(directory / "pytorch_model.bin"))
        (directory / "model.safetensors").unlink()
    tokenizer.save_pretrained(directory)
    config = {"query_token_id": "[unused0]", "doc_token_id": "[unused1]", "query_token": "[Q]", "doc_token": "[D]",
              "dim": dim, "doc_maxlen": doc_maxlen, "mask_punctuation": True, "query_maxlen": query_maxlen,
              "attend_to_mask_tokens": attend_to_mask_tokens, "interaction": "colbert", "similarity": "cosine",
              "model_name": "bert-base-uncased", "nbits": 2, "checkpoint": "colbert-ir/colbertv2.0",
              **metadata, "meta": {"version": "colbert-v0.4"}}
    (directory / "artifact.metadata").write_text(json.dumps(config, indent=4) + "\n")
    return directory
