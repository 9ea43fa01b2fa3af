"""``embedserve tokenize`` prints the reference's ids and pieces; bad files exit non-zero."""

from __future__ import annotations

import json

from embedserve.cli import main


def test_tokenize_prints_ids_and_pieces(capsys, tokenizer_cache_dir, xlmr_tokenizer_dir, default_sp_reference):
    model = xlmr_tokenizer_dir / "sentencepiece.bpe.model"
    text = "Hello  wörld, ｶﾞ <s>"
    assert main(["tokenize", "--model", str(model), "--trie-cache-dir", str(tokenizer_cache_dir),
                 "--json", "--no-special", text]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ids"] == default_sp_reference.encode(text)
    assert out["pieces"] == default_sp_reference.encode(text, out_type=str)

    assert main(["tokenize", "--model", str(model), "--trie-cache-dir", str(tokenizer_cache_dir), text]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[1:] == [str(i) for i in [1] + default_sp_reference.encode(text) + [2]]
    assert lines[1].split()[1:] == ["<s>"] + default_sp_reference.encode(text, out_type=str) + ["</s>"]


def test_tokenize_unsupported_file_exits_2(capsys, tmp_path):
    bad = tmp_path / "bad.model"
    bad.write_bytes(b"\xff" * 16)
    assert main(["tokenize", "--model", str(bad), "--trie-cache-dir", str(tmp_path), "x"]) == 2
    assert str(bad) in capsys.readouterr().out


def test_tokenize_without_model_uses_the_default_model(capsys, default_model_dir, tokenizer_cache_dir):
    import tokenizers

    reference = tokenizers.Tokenizer.from_file(str(default_model_dir / "tokenizer.json"))
    text = "how do I bake bread? ¿Cómo hornear pan?"
    assert main(["tokenize", "--cache-dir", str(default_model_dir.parent),
                 "--trie-cache-dir", str(tokenizer_cache_dir), "--json", text]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ids"] == reference.encode(text).ids
    assert out["pieces"] == reference.encode(text).tokens
