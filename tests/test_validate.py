"""One validator (embedserve/validate.py): its rules, and the same words from every tier.

The cross-tier test sends each bad input to a real gateway (HTTP), straight
to the real scheduler process behind it (gRPC), and to an engine loaded
here, and asserts that the three messages are identical.
"""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from embedserve import ragged, validate
from embedserve.engine import Batch, Engine
from embedserve.errors import InputTooLong, InvalidInput
from embedserve.link import wire
from embedserve.model.postprocess import postprocess_embeddings
from embedserve.protos import inference_pb2, inference_pb2_grpc
from embedserve.ragged import RaggedBatch
from embedserve.tokenizer import Tokenizer
from gateway_harness import GatewayServer, gateway_settings


def _batch(ids: list[int], cu_seqlens: list[int], types: list[int] | None = None) -> RaggedBatch:
    return RaggedBatch(np.array(ids, np.int32), np.array(cu_seqlens, np.int32),
                       None if types is None else np.array(types, np.int32))


@pytest.mark.parametrize("batch, words, field", [
    (_batch([], [0]), "no sequences", "tokens.lengths"),
    (_batch([5, 6], [1, 2]), "cu_seqlens must start at 0, not 1", "tokens.cu_seqlens"),
    (_batch([5, 6], [0, 2, 2]), "sequence 1 has 0 tokens; every sequence needs at least one",
     "tokens.lengths"),
    (_batch([5, 6, 7], [0, 2, 1, 3]), "sequence 1 has -1 tokens", "tokens.lengths"),
    (_batch([5, 6, 7], [0, 2]), "the sequence lengths add up to 2, but there are 3 token ids",
     "tokens.lengths"),
    (_batch([5, 6], [0, 2], [0]), "token_type_ids holds 1 entries for 2 token ids",
     "tokens.token_type_ids"),
    (RaggedBatch(np.array([5, 6]), np.array([0, 2])), "must be int32", "tokens.cu_seqlens"),
])
def test_malformed_layouts_are_refused_naming_the_field(batch, words, field):
    with pytest.raises(InvalidInput) as info:
        validate.check_ragged(batch, "tokens")
    assert words in info.value.message and info.value.field == field


class Limits:
    vocab_size, max_positions, type_vocab_size = 100, 4, 2


@pytest.mark.parametrize("batch, error, words, field", [
    (_batch([1, 2, 3, 100], [0, 2, 4]), InvalidInput,
     "sequence 1 has token id 100, outside the vocabulary [0, 100)", "input[1]"),
    (_batch([1, -1], [0, 1, 2]), InvalidInput, "sequence 1 has token id -1", "input[1]"),
    (_batch([1] * 11, [0, 1, 6, 11]), InputTooLong,
     "sequence 1 has 5 tokens; the model takes at most 4 (2 sequences are too long)", "input[1]"),
    (_batch([1, 2], [0, 2], [0, 2]), InvalidInput,
     "token_type_ids must lie in [0, 2); sequence 0 has 2", "input.token_type_ids"),
])
def test_a_batch_that_does_not_fit_the_model_names_the_sequence(batch, error, words, field):
    with pytest.raises(error) as info:
        validate.check_fits_model(batch, Limits(), "input")
    assert type(info.value) is error
    assert info.value.message == words or info.value.message.startswith(words)
    assert info.value.field == field


def test_a_batch_that_fits_passes_every_check():
    batch = _batch([1, 99, 0, 5], [0, 2, 4], [0, 1, 0, 1])
    validate.check_ragged(batch)
    validate.check_fits_model(batch, Limits())
    validate.check_dimensions(1, 32)
    validate.check_dimensions(32, 32)


@pytest.mark.parametrize("dimensions", [0, 33, -1])
def test_dimensions_outside_the_vectors_are_refused(dimensions):
    with pytest.raises(InvalidInput, match=rf"dimensions must lie in \[1, 32\], got {dimensions}"):
        validate.check_dimensions(dimensions, 32)


def test_too_long_carries_index_length_and_limit():
    with pytest.raises(InputTooLong) as info:
        validate.check_lengths(np.array([3, 9, 2]), 8, "texts")
    assert (info.value.index, info.value.length, info.value.limit) == (1, 9, 8)


# --- the same message from every tier -------------------------------------


@pytest.fixture(scope="module")
def tiers(tiny_bert_dir, tiny_bert_replica):
    """A scheduler process (the session's), a gateway in front of it, a gRPC stub to it, an engine here."""
    replica = tiny_bert_replica
    gateway = GatewayServer(gateway_settings(tiny_bert_dir, [replica.address]))
    channel = grpc.insecure_channel(replica.address)
    engine = Engine.load(tiny_bert_dir)
    try:
        gateway.wait_ready()
        template = Tokenizer.from_model_dir(tiny_bert_dir).encode_batch([""]).token_ids
        yield gateway, inference_pb2_grpc.InferenceStub(channel), engine, template
    finally:
        engine.close()
        channel.close()
        gateway.stop()


def _messages(tiers, raw_ids: list[list[int]], dimensions: int | None = None) -> tuple[str, str, str]:
    """The error message for ``raw_ids`` (ids without specials) from the gateway, scheduler, engine."""
    gateway, stub, engine, template = tiers
    body: dict = {"inputs": raw_ids}
    if dimensions is not None:
        body["dimensions"] = dimensions
    with gateway.client() as http:
        response = http.post("/embed", json=body)
    assert response.status_code in (400, 413), response.text
    http_message = response.json()["error"]["message"]

    # What the gateway would send: each sequence inside the model's specials.
    sequences = [np.concatenate([template[:1], ids, template[1:]]) for ids in raw_ids]
    request = inference_pb2.EmbedRequest(tokens=wire.pack_tokens(ragged.from_sequences(sequences)),
                                         dimensions=dimensions or 0)
    with pytest.raises(grpc.RpcError) as rpc:
        stub.Embed(request, timeout=30)
    assert rpc.value.code() is grpc.StatusCode.INVALID_ARGUMENT

    with pytest.raises(InvalidInput) as direct:
        rows = engine.step(Batch.from_sequences(sequences)).wait()
        postprocess_embeddings(rows, False, dimensions)  # dimensions apply after the engine
    return http_message, rpc.value.details(), direct.value.message


def test_an_id_outside_the_vocabulary_reads_the_same_in_every_tier(tiers):
    messages = _messages(tiers, [[5, 6], [7, 250_002]])
    assert messages[0] == "sequence 1 has token id 250002, outside the vocabulary [0, 250002)"
    assert len(set(messages)) == 1, messages


def test_a_sequence_too_long_reads_the_same_in_every_tier(tiers):
    messages = _messages(tiers, [[5] * 8, [6] * 600])
    cause = "sequence 1 has 602 tokens; the model takes at most 512"
    # Every tier names the same cause; the HTTP tier, the one users read, adds how to fix it.
    assert messages[1:] == (cause, cause), messages
    assert messages[0].startswith(cause + "; set the request's \"truncate\"") and "--auto-truncate" in messages[0]


def test_dimensions_beyond_the_model_read_the_same_in_every_tier(tiers):
    messages = _messages(tiers, [[5, 6]], dimensions=33)
    assert messages[0] == "dimensions must lie in [1, 32], got 33"
    assert len(set(messages)) == 1, messages
