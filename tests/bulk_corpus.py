"""Documents for the bulk tests, made here: English reference prose of mixed lengths and a few
sentences in other scripts. Every one fits in 512 tokens."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import python_docs_text

OTHER_SCRIPTS = [
    "Tous les êtres humains naissent libres et égaux en dignité et en droits.",
    "Alle Menschen sind frei und gleich an Würde und Rechten geboren.",
    "Все люди рождаются свободными и равными в своем достоинстве и правах.",
    "人人生而自由，在尊严和权利上一律平等。",
    "すべての人間は、生まれながらにして自由であり、かつ、尊厳と権利とについて平等である。",
    "जन्म से सभी मनुष्य स्वतंत्र हैं और गरिमा और अधिकारों में समान हैं।",
    "كل الناس يولدون أحرارًا متساوين في الكرامة والحقوق.",
]


def documents(count: int) -> list[str]:
    """``count`` documents: paragraphs of 1 to ~300 words, interleaved with OTHER_SCRIPTS."""
    paragraphs = [" ".join(p.split()) for p in python_docs_text().split("\n\n")]
    paragraphs = [p[:1200] for p in paragraphs if len(p) > 20]
    out: list[str] = []
    i = 0
    while len(out) < count:
        out.append(OTHER_SCRIPTS[i % len(OTHER_SCRIPTS)] if i % 9 == 4 else paragraphs[(i * 37) % len(paragraphs)])
        i += 1
    return out


def write_jsonl(path: Path, texts: list[str], ids: list[str] | None = None) -> Path:
    with open(path, "w") as f:
        for i, text in enumerate(texts):
            record = {"text": text} if ids is None else {"id": ids[i], "text": text}
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    return path
