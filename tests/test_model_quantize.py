"""embedserve.model.quantize against sentence-transformers' quantize_embeddings, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sentence_transformers.util.quantization import quantize_embeddings

from embedserve.errors import InvalidInput
from embedserve.model.quantize import PRECISIONS, calibrate, check_precision, output_dtype, output_width, quantize

REFERENCE_PRECISIONS = ("float32", "int8", "uint8", "binary", "ubinary")


def _unit_vectors(rng: np.random.Generator, rows: int, dim: int) -> np.ndarray:
    v = rng.standard_normal((rows, dim)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def _assert_identical(ours: np.ndarray, reference: np.ndarray) -> None:
    assert ours.dtype == reference.dtype
    assert ours.shape == reference.shape
    assert ours.tobytes() == reference.tobytes()


@pytest.mark.parametrize("dim", [1, 7, 8, 13, 384])
@pytest.mark.parametrize("precision", REFERENCE_PRECISIONS)
def test_quantize_matches_sentence_transformers(precision: str, dim: int) -> None:
    rng = np.random.default_rng(dim)
    sample = _unit_vectors(rng, 300, dim)
    ranges = calibrate(sample)
    # Fresh vectors, some outside the sample's ranges, so clipping is exercised.
    queries = _unit_vectors(rng, 50, dim) * np.float32(1.3)
    reference = quantize_embeddings(queries, precision, ranges=ranges)
    _assert_identical(quantize(queries, precision, ranges), reference)


def test_calibrate_matches_calibration_embeddings() -> None:
    # Ranges from calibrate() quantize exactly as sentence-transformers'
    # calibration_embeddings path, which computes its own min/max.
    rng = np.random.default_rng(0)
    sample, queries = _unit_vectors(rng, 200, 32), _unit_vectors(rng, 20, 32)
    for precision in ("int8", "uint8"):
        reference = quantize_embeddings(queries, precision, calibration_embeddings=sample)
        _assert_identical(quantize(queries, precision, calibrate(sample)), reference)
    assert calibrate(sample).dtype == np.float32 and calibrate(sample).shape == (2, 32)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), rows=st.integers(1, 9), dim=st.integers(1, 40),
       scale=st.sampled_from([1e-3, 1.0, 7.5]))
def test_property_any_shape_and_scale(seed: int, rows: int, dim: int, scale: float) -> None:
    rng = np.random.default_rng(seed)
    sample = (rng.standard_normal((10, dim)) * scale).astype(np.float32)
    queries = (rng.standard_normal((rows, dim)) * scale).astype(np.float32)
    # Exact zeros and sample edges: the binary threshold is strictly > 0 and
    # values equal to a range's ends land in the end buckets.
    queries[0, 0] = 0.0
    queries[-1, -1] = sample[:, -1].max()
    ranges = calibrate(sample)
    for precision in REFERENCE_PRECISIONS:
        _assert_identical(quantize(queries, precision, ranges),
                          quantize_embeddings(queries, precision, ranges=ranges))


def test_constant_dimension_matches_reference() -> None:
    # A dimension whose min equals its max has a zero step; both put it in bucket 0.
    sample = np.ones((5, 4), dtype=np.float32)
    sample[:, 1] = np.linspace(-1, 1, 5)
    queries = np.array([[1.0, 0.3, 1.0, 2.0], [0.5, -0.3, 1.0, 0.0]], dtype=np.float32)
    ranges = calibrate(sample)
    for precision in ("int8", "uint8"):
        _assert_identical(quantize(queries, precision, ranges),
                          quantize_embeddings(queries, precision, ranges=ranges))


def test_float16_is_a_cast() -> None:
    v = _unit_vectors(np.random.default_rng(3), 4, 10)
    out = quantize(v, "float16")
    assert out.dtype == np.float16 and np.array_equal(out, v.astype(np.float16))


def test_output_dtype_and_width_describe_quantize() -> None:
    v = _unit_vectors(np.random.default_rng(4), 3, 13)
    ranges = calibrate(_unit_vectors(np.random.default_rng(5), 20, 13))
    for precision in PRECISIONS:
        out = quantize(v, precision, ranges)
        assert out.dtype == output_dtype(precision)
        assert out.shape == (3, output_width(precision, 13))


def test_unknown_precision_names_the_field() -> None:
    with pytest.raises(InvalidInput) as caught:
        check_precision("int4", field="embedding_types[1]")
    assert caught.value.field == "embedding_types[1]"
    assert "int4" in str(caught.value) and "ubinary" in str(caught.value)


def test_ranged_precision_needs_matching_ranges() -> None:
    v = np.zeros((2, 8), dtype=np.float32)
    with pytest.raises(InvalidInput, match="calibration ranges"):
        quantize(v, "int8", None)
    with pytest.raises(InvalidInput, match=r"expected \(2, 8\)"):
        quantize(v, "uint8", np.zeros((2, 4), dtype=np.float32))


def test_calibrate_needs_two_vectors() -> None:
    with pytest.raises(InvalidInput):
        calibrate(np.zeros((1, 8), dtype=np.float32))
