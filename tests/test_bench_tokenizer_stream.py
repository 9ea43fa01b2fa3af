"""bench/tokenizer_bench.py's stream rows: each text once, the reference and two copies of
ours (word cache cleared first, and none) taking turns in rotating order; twice, the
copies built in one order and then the other."""

from __future__ import annotations

import pytest

from bench.tokenizer_bench import stream_to_reference


class Recorder:
    """Stands for a Tokenizer: records its making, encode() and clear_word_cache() calls
    in the list it is built on (its ``spec``, which every copy shares)."""

    def __init__(self, spec: list, word_cache_slots: int = 1) -> None:
        self.log = self.spec = spec
        self.name = "cold" if word_cache_slots else "off"
        self.log.append(("made", self.name))

    def encode(self, text: str) -> None:
        self.log.append((self.name, text))

    def clear_word_cache(self) -> None:
        self.log.append(("clear", None))


def test_each_text_once_in_rotating_order_after_a_cleared_cache():
    log: list = []
    ours = Recorder(log)
    del log[:]
    ratios = stream_to_reference(ours, lambda t: log.append(("ref", t)), ["a", "b", "c", "d"])
    stream = [("ref", "a"), ("cold", "a"), ("off", "a"),
              ("cold", "b"), ("off", "b"), ("ref", "b"),
              ("off", "c"), ("ref", "c"), ("cold", "c"),
              ("ref", "d"), ("cold", "d"), ("off", "d")]
    # Twice: the copies built (and bound) cold first, then off first; cleared, then the stream.
    assert log == [("made", "cold"), ("made", "off"), ("cold", "a"), ("off", "a"), ("clear", None), *stream,
                   ("made", "off"), ("made", "cold"), ("off", "a"), ("cold", "a"), ("clear", None), *stream]
    assert set(ratios) == {"cold", "off"} and all(r > 0 for r in ratios.values())


def test_the_ratio_is_ours_over_the_reference(monkeypatch: pytest.MonkeyPatch):
    """With the clock advancing 1 per reference call and 3 per call of ours, both read 3."""
    clock = [0]
    monkeypatch.setattr("bench.tokenizer_bench.time.perf_counter_ns", lambda: clock[0])

    class Timed(Recorder):
        def encode(self, text: str) -> None:
            clock[0] += 3

    def reference(text: str) -> None:
        clock[0] += 1

    ratios = stream_to_reference(Timed([]), reference, ["a", "b", "c"])
    assert ratios == pytest.approx({"cold": 3.0, "off": 3.0})
