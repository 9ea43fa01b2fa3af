"""bench/tokenizer_bench.py's stream rows: each text once, ours and the reference
alternating which goes first, the word cache cleared before the first text."""

from __future__ import annotations

from bench.tokenizer_bench import stream_to_reference


class Recorder:
    """Stands for a Tokenizer: records encode() and clear_word_cache() calls in the list
    it is built on (its ``spec``, which a copy without a cache shares)."""

    def __init__(self, spec: list, word_cache_slots: int = 1) -> None:
        self.log = self.spec = spec
        self.slots = word_cache_slots

    def encode(self, text: str) -> None:
        self.log.append(("ours" if self.slots else "ours off", text))

    def clear_word_cache(self) -> None:
        self.log.append(("clear", None))


def test_each_text_once_alternating_after_a_cleared_cache():
    log: list = []
    ratio = stream_to_reference(Recorder(log), lambda t: log.append(("ref", t)), ["a", "b", "c"], "cold")
    assert log == [("clear", None), ("ref", "a"), ("ours", "a"), ("ours", "b"), ("ref", "b"),
                   ("ref", "c"), ("ours", "c")]
    assert ratio > 0


def test_off_runs_a_copy_without_a_cache():
    log: list = []
    stream_to_reference(Recorder(log), lambda t: log.append(("ref", t)), ["a", "b"], "off")
    assert [name for name, _ in log if name.startswith("ours")] == ["ours off"] * 3  # one to bind, one a text
