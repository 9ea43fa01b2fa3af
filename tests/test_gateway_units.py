"""Gateway pieces that need no server: chunk planning, the error maps, the token budget."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from embedserve import errors
from embedserve.gateway.budget import TokenBudget
from embedserve.gateway.chunking import plan_chunks
from embedserve.gateway.http_errors import ERROR_RESPONSES, HTTP_STATUSES, STATUS_BY_ERROR, error_body, status_for
from embedserve.gateway.middleware import server_timing
from embedserve.link.status import from_rpc_error, is_retryable


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(lengths=st.lists(st.integers(1, 600), max_size=200), max_sequences=st.integers(1, 40),
       max_tokens=st.integers(1, 2000))
def test_chunks_cover_inputs_in_order_within_bounds(lengths, max_sequences, max_tokens):
    chunks = plan_chunks(np.array(lengths, dtype=np.int32), max_sequences, max_tokens)
    covered = [i for start, stop in chunks for i in range(start, stop)]
    assert covered == list(range(len(lengths)))           # nothing lost, duplicated or moved
    for start, stop in chunks:
        assert 0 < stop - start <= max_sequences
        tokens = sum(lengths[start:stop])
        assert tokens <= max_tokens or stop - start == 1   # only a lone long sequence exceeds
    # Greedy: a chunk stops only when the next sequence would not fit.
    for (start, stop), _ in zip(chunks, chunks[1:]):
        assert stop - start == max_sequences or sum(lengths[start:stop + 1]) > max_tokens


def test_chunk_table():
    assert plan_chunks(np.array([3, 3, 3, 3]), 2, 100) == [(0, 2), (2, 4)]
    assert plan_chunks(np.array([5, 200, 5]), 10, 100) == [(0, 1), (1, 2), (2, 3)]
    assert plan_chunks(np.array([], dtype=np.int32), 4, 10) == []
    with pytest.raises(ValueError):
        plan_chunks(np.array([1]), 0, 10)


def test_every_error_class_has_an_http_status():
    expected = {errors.InvalidInput: 400, errors.InputTooLong: 413, errors.ModelNotFound: 404,
                errors.Overloaded: 429,
                errors.Unavailable: 503, errors.DeviceLost: 503, errors.DeadlineExceeded: 504,
                errors.Cancelled: 499,
                errors.ModelLoadError: 503, errors.EmbedServeError: 500}
    assert set(STATUS_BY_ERROR) == set(errors.ALL_ERRORS) == set(expected)
    for cls in errors.ALL_ERRORS:
        assert status_for(cls("x"))[0] == expected[cls]

    class Subclass(errors.Overloaded):
        pass

    assert status_for(Subclass("x"))[0] == 429  # found through the class hierarchy


def test_every_error_status_is_in_the_one_status_table():
    for status, _ in STATUS_BY_ERROR.values():
        assert status in HTTP_STATUSES
    # OpenAPI declares exactly the statuses the table describes for routes.
    assert set(ERROR_RESPONSES) == {s for s, entry in HTTP_STATUSES.items() if entry.description}
    assert error_body(413, "big", "input", "body_too_large") == {"error": {
        "message": "big", "type": "invalid_request_error", "param": "input", "code": "body_too_large"}}
    assert error_body(418, "odd")["error"]["type"] == "invalid_request_error"  # unlisted: by class
    assert error_body(502, "odd")["error"]["type"] == "server_error"


def test_every_grpc_code_becomes_an_embedserve_error():
    expected = {grpc.StatusCode.INVALID_ARGUMENT: errors.InvalidInput,
                grpc.StatusCode.NOT_FOUND: errors.ModelNotFound,
                grpc.StatusCode.RESOURCE_EXHAUSTED: errors.Overloaded,
                grpc.StatusCode.UNAVAILABLE: errors.Unavailable,
                grpc.StatusCode.DEADLINE_EXCEEDED: errors.DeadlineExceeded,
                grpc.StatusCode.CANCELLED: errors.Unavailable,
                # A replica refusing the gateway's token: 503 naming the setting, not a 500.
                grpc.StatusCode.UNAUTHENTICATED: errors.Unavailable}
    for code in grpc.StatusCode:
        if code == grpc.StatusCode.OK:
            continue
        error = from_rpc_error(code, "details")
        assert isinstance(error, errors.EmbedServeError)
        assert type(error) is expected.get(code, errors.EmbedServeError), code
        status_for(error)  # and it has an HTTP status
    assert is_retryable(grpc.StatusCode.UNAVAILABLE)
    assert not is_retryable(grpc.StatusCode.INVALID_ARGUMENT)
    assert not is_retryable(grpc.StatusCode.DEADLINE_EXCEEDED)
    assert not is_retryable(grpc.StatusCode.UNAUTHENTICATED)   # every replica would refuse it alike
    assert "replica-token-file" in from_rpc_error(grpc.StatusCode.UNAUTHENTICATED, "refused").message


def test_token_budget_admits_refuses_and_gives_back():
    budget = TokenBudget(100, retry_after_s=2)
    with budget.hold(60):
        assert budget.in_use == 60
        with pytest.raises(errors.Overloaded) as refused:
            with budget.hold(50):
                pass
        assert refused.value.retry_after_s == 2
        with budget.hold(40):
            assert budget.in_use == 100
    assert budget.in_use == 0
    with pytest.raises(errors.InputTooLong):
        with budget.hold(101):
            pass
    with pytest.raises(RuntimeError):
        with budget.hold(10):
            raise RuntimeError("work failed")
    assert budget.in_use == 0


def test_server_timing_header_format():
    assert server_timing({"tokenize": 0.0012, "total": 0.5}) == "tokenize;dur=1.200, total;dur=500.000"
