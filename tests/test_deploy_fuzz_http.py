"""Property-based fuzzing of the gateway's HTTP API from its own OpenAPI schema.

schemathesis generates requests for every operation the gateway publishes at
/openapi.json, valid and invalid ones, and sends them to a real gateway in
front of a real replica (default model). Every answer must be a non-5xx
status the schema declares, with the declared content type and a body that
matches the declared schema. Afterwards the same server must still answer a
known request correctly (vectors equal to sentence-transformers').
"""

from __future__ import annotations

import numpy as np
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from gateway_harness import GatewayServer, gateway_in_front_of

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_schema_conformance]
# Examples per operation and mode (valid, invalid): about a minute on 2 CPU cores.
EXAMPLES_PER_OPERATION = 15


@pytest.fixture(scope="module")
def fuzz_stack(default_replica):
    # Small request limits keep generated inputs cheap; the bounds themselves
    # are part of what is fuzzed (413/422 answers must match the schema too).
    with gateway_in_front_of(default_replica, max_inputs=64, max_body_bytes=256 * 1024,
                             request_timeout_s=30.0) as gateway:
        yield gateway


def test_gateway_answers_fuzzed_requests_within_its_schema(fuzz_stack: GatewayServer) -> None:
    schema = schemathesis.openapi.from_url(f"{fuzz_stack.url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert any(op.path == "/v1/embeddings" for op in operations), [op.label for op in operations]
    failures: list[str] = []
    calls = 0
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            @given(case=operation.as_strategy(mode))
            @settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, database=None,
                      suppress_health_check=list(HealthCheck), derandomize=True,
                      phases=[Phase.explicit, Phase.generate])
            def fuzz(case) -> None:  # noqa: ANN001
                nonlocal calls
                calls += 1
                case.call_and_validate(base_url=fuzz_stack.url, checks=CHECKS, timeout=60)

            try:
                fuzz()
            except Unsatisfiable:
                # No invalid request exists for an operation without inputs.
                assert mode is GenerationMode.NEGATIVE, operation.label
            except (Exception, BaseExceptionGroup) as exc:  # collect every operation's failure
                failures.append(f"{operation.label} [{mode.value}]: {str(exc)[:1500]}")
    assert not failures, "\n\n".join(failures)
    with_body = [op for op in operations if op.method.upper() == "POST"]
    assert calls >= EXAMPLES_PER_OPERATION * len(with_body)


def test_gateway_still_answers_correctly_after_fuzzing(fuzz_stack: GatewayServer,
                                                       probe_reference) -> None:
    texts = list(probe_reference.texts[:4])
    with fuzz_stack.client() as client:
        model = client.get("/v1/models").json()["data"][0]["id"]
        response = client.post("/v1/embeddings", json={"model": model, "input": texts})
    assert response.status_code == 200, response.text
    vectors = np.asarray([item["embedding"] for item in response.json()["data"]], dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    cosines = np.sum(vectors * probe_reference.vectors[:4], axis=1)
    assert cosines.min() >= 0.9999, cosines
