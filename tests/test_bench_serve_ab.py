"""bench serve_ab's order and arithmetic, its one-line stop without the reference data, and the overhead
bench's helpers."""

from __future__ import annotations

import numpy as np
import pytest

from bench.overhead_bench import bursts, child_pids, compiling_tokenizer, environment_and_flags
from bench.reference_data import MISSING_EXIT_STATUS
from bench.serve_ab import abba, main, ratios


def test_rounds_alternate_abba() -> None:
    assert abba(1) == ["a", "b"]
    assert abba(4) == ["a", "b", "b", "a", "a", "b", "b", "a"]


def test_ratios_are_b_over_a_per_round() -> None:
    assert ratios({"a": [100.0, 200.0], "b": [150.0, 100.0]}) == [1.5, 0.5]
    with pytest.raises(ValueError):
        ratios({"a": [1.0], "b": []})


def test_stops_at_missing_reference_data_with_one_line(tmp_path, capsys) -> None:
    assert main(["--data-dir", str(tmp_path)]) == MISSING_EXIT_STATUS
    error = capsys.readouterr().err
    assert error.startswith("python -m bench serve_ab: reference data not found") and error.count("\n") == 1


def test_a_configuration_is_environment_words_then_flags() -> None:
    assert environment_and_flags(["GLIBC_TUNABLES=glibc.malloc.perturb=0", "X=1", "--cpu-lanes", "1"]) == (
        {"GLIBC_TUNABLES": "glibc.malloc.perturb=0", "X": "1"}, ["--cpu-lanes", "1"])
    assert environment_and_flags([]) == ({}, [])
    assert environment_and_flags(["--replicas", "2"]) == ({}, ["--replicas", "2"])


def test_a_stack_compiling_its_tokenizer_is_seen_in_its_children() -> None:
    """The overhead bench measures a stack only once no child of it compiles tokenizer
    kernels (embedserve/tokenizer/warm.py's command line): a real child of this process."""
    import os
    import subprocess
    import sys

    assert not compiling_tokenizer(os.getpid())
    script = "import sys, time; sys.argv; time.sleep(30)  # embedserve.tokenizer.warm"
    child = subprocess.Popen([sys.executable, "-c", script])
    try:
        assert compiling_tokenizer(os.getpid())
        assert child.pid in child_pids(os.getpid())
    finally:
        child.kill()
        child.wait()
    assert not compiling_tokenizer(os.getpid())
    assert child.pid not in child_pids(os.getpid())


def test_tail_requests_less_than_a_second_apart_are_one_burst() -> None:
    assert bursts(np.array([])) == 0
    assert bursts(np.array([5.0])) == 1
    assert bursts(np.array([10.2, 3.0, 3.4, 10.0, 3.9])) == 2        # unsorted: 3.0-3.9 and 10.0-10.2
    assert bursts(np.array([0.0, 1.0, 2.0])) == 3                    # a second apart: spells of their own
