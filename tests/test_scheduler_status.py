"""Every embedserve error maps to a deliberate gRPC status code (embedserve/link/status.py)."""

from __future__ import annotations

import grpc
import pytest

from embedserve import errors
from embedserve.link.status import GRPC_CODES, INTERNAL_MESSAGE, grpc_status


def test_every_error_class_has_its_own_entry():
    assert set(GRPC_CODES) == set(errors.ALL_ERRORS)


@pytest.mark.parametrize("error, code", [
    (errors.InvalidInput("bad"), grpc.StatusCode.INVALID_ARGUMENT),
    (errors.InputTooLong("long", index=1, length=600, limit=512), grpc.StatusCode.INVALID_ARGUMENT),
    (errors.Overloaded("full"), grpc.StatusCode.RESOURCE_EXHAUSTED),
    (errors.Unavailable("draining"), grpc.StatusCode.UNAVAILABLE),
    (errors.DeviceLost("a sticky CUDA error"), grpc.StatusCode.UNAVAILABLE),
    (errors.DeadlineExceeded("late"), grpc.StatusCode.DEADLINE_EXCEEDED),
    (errors.Cancelled("gone"), grpc.StatusCode.CANCELLED),
    (errors.ModelLoadError("broken"), grpc.StatusCode.INTERNAL),
])
def test_client_actionable_codes_keep_the_message(error, code):
    assert grpc_status(error) == (code, error.message)


def test_a_subclass_not_in_the_table_maps_through_its_parent():
    class TooManyIds(errors.InputTooLong):
        pass

    assert grpc_status(TooManyIds("x"))[0] is grpc.StatusCode.INVALID_ARGUMENT


def test_foreign_errors_are_internal_without_their_text():
    code, message = grpc_status(RuntimeError("CUDA error at /secret/path.cu:42"))
    assert code is grpc.StatusCode.INTERNAL and message == INTERNAL_MESSAGE
    assert "secret" not in message
