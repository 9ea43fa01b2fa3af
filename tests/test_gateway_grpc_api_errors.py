"""The public gRPC API's error statuses (gateway/grpc_api_errors.py): every error class
mapped, and the google.rpc details a client reads back."""

from __future__ import annotations

import grpc
import pytest
from google.rpc import code_pb2, error_details_pb2, status_pb2

from embedserve import errors
from embedserve.gateway.grpc_api_errors import DETAILS_KEY, ApiStatus, api_status
from embedserve.gateway.http_errors import STATUS_BY_ERROR


def _instance(cls: type[errors.EmbedServeError]) -> errors.EmbedServeError:
    return cls("nobody") if cls is errors.ModelNotFound else cls("a message")


def _unpacked(status: ApiStatus) -> tuple[status_pb2.Status, dict[str, object]]:
    ((key, raw),) = status.trailing_metadata()
    assert key == DETAILS_KEY
    rich = status_pb2.Status.FromString(raw)
    found: dict[str, object] = {}
    for detail in rich.details:
        for kind in (error_details_pb2.ErrorInfo, error_details_pb2.BadRequest,
                     error_details_pb2.RetryInfo):
            if detail.Is(kind.DESCRIPTOR):
                found[kind.__name__] = kind()
                detail.Unpack(found[kind.__name__])
    return rich, found


@pytest.mark.parametrize("cls", errors.ALL_ERRORS, ids=lambda c: c.__name__)
def test_every_error_class_has_a_code_a_reason_and_details(cls) -> None:
    status = api_status(_instance(cls))
    assert status.code not in (grpc.StatusCode.OK, grpc.StatusCode.UNKNOWN)
    # The reason is HTTP's error.code for the same class: one name on both transports.
    assert status.reason == STATUS_BY_ERROR[cls][1]
    rich, details = _unpacked(status)
    assert rich.code == status.code.value[0] and rich.message == status.message
    assert details["ErrorInfo"].reason == status.reason and details["ErrorInfo"].domain == "embedserve"


@pytest.mark.parametrize("error, code", [
    (errors.InvalidInput("bad", field="truncate"), grpc.StatusCode.INVALID_ARGUMENT),
    (errors.InputTooLong("long", index=1, length=600, limit=512, field="inputs[1]"),
     grpc.StatusCode.INVALID_ARGUMENT),
    (errors.ModelNotFound("gpt-17"), grpc.StatusCode.NOT_FOUND),
    (errors.Overloaded("full", retry_after_s=2.5), grpc.StatusCode.RESOURCE_EXHAUSTED),
    (errors.Unavailable("draining"), grpc.StatusCode.UNAVAILABLE),
    (errors.DeadlineExceeded("late"), grpc.StatusCode.DEADLINE_EXCEEDED),
    (errors.Cancelled("gone"), grpc.StatusCode.CANCELLED),
])
def test_client_errors_get_their_own_code(error, code) -> None:
    assert api_status(error).code == code


def test_a_too_long_input_names_its_index_and_the_fix() -> None:
    error = errors.InputTooLong("sequence 3 has 900 tokens; the model takes at most 512", index=3,
                                length=900, limit=512, field="inputs[3]")
    _, details = _unpacked(api_status(error))
    (violation,) = details["BadRequest"].field_violations
    assert violation.field == "inputs[3]"
    assert violation.description.startswith(error.message) and "truncate" in violation.description
    assert details["ErrorInfo"].metadata["field"] == "inputs[3]"


def test_too_many_inputs_says_to_split_them() -> None:
    error = errors.InputTooLong("inputs has 9000 inputs; at most 8192", length=9000, limit=8192,
                                field="inputs")
    _, details = _unpacked(api_status(error))
    assert "split" in details["BadRequest"].field_violations[0].description


@pytest.mark.parametrize("error, seconds", [(errors.Overloaded("full", retry_after_s=2.5), 3),
                                            (errors.Unavailable("no replica"), 1)])
def test_retryable_errors_say_when_to_retry(error, seconds) -> None:
    _, details = _unpacked(api_status(error))
    assert details["RetryInfo"].retry_delay.seconds == seconds
    assert "BadRequest" not in details


def test_grpc_and_google_rpc_number_the_codes_alike() -> None:
    # A StreamError's code and google.rpc.Status.code are grpc.StatusCode's numbers.
    for code in grpc.StatusCode:
        assert code.value[0] == code_pb2.Code.Value(code.name)
