"""The wire codec (embedserve.link.wire): round trips of batches, tensors and model info; malformed messages."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from embedserve import ragged
from embedserve.errors import InvalidInput
from embedserve.link import wire
from embedserve.model.info import ModelInfo
from embedserve.protos import inference_pb2


@settings(max_examples=100, deadline=None)
@given(lengths=st.lists(st.integers(1, 20), min_size=1, max_size=12), with_types=st.booleans(),
       seed=st.integers(0, 2**32 - 1))
def test_tokens_round_trip_through_serialized_bytes(lengths, with_types, seed):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 250_002, size=sum(lengths), dtype=np.int64)  # any int dtype in
    types = rng.integers(0, 2, size=sum(lengths)) if with_types else None
    packed = wire.pack_tokens(ragged.from_lengths(ids, np.array(lengths), types))
    message = inference_pb2.PackedTokens.FromString(packed.SerializeToString())
    tokens = wire.unpack_tokens(message)
    assert tokens.token_ids.dtype == np.int32 and tokens.cu_seqlens.dtype == np.int32
    assert tokens.token_ids.tolist() == ids.tolist()
    assert tokens.lengths.tolist() == lengths
    assert tokens.cu_seqlens.tolist() == [0, *np.cumsum(lengths).tolist()]
    if with_types:
        assert tokens.token_type_ids.tolist() == types.tolist()
    else:
        assert tokens.token_type_ids is None


def test_bytes_are_little_endian_int32():
    packed = wire.pack_tokens(ragged.from_sequences([[1, 258], [7]]))
    assert packed.token_ids == b"\x01\x00\x00\x00\x02\x01\x00\x00\x07\x00\x00\x00"
    assert packed.lengths == b"\x02\x00\x00\x00\x01\x00\x00\x00"


def _packed(ids: bytes, lengths: bytes, types: bytes = b"") -> inference_pb2.PackedTokens:
    return inference_pb2.PackedTokens(token_ids=ids, lengths=lengths, token_type_ids=types)


def _i32(*values: int) -> bytes:
    return np.array(values, dtype="<i4").tobytes()


@pytest.mark.parametrize("message, field", [
    (_packed(b"", b""), "tokens.lengths"),                                 # no sequences
    (_packed(_i32(1, 2) + b"\x00", _i32(2)), "tokens.token_ids"),          # ragged byte count
    (_packed(_i32(1, 2), _i32(2)[:3]), "tokens.lengths"),
    (_packed(_i32(1, 2), _i32(1, 0, 1)), "tokens.lengths"),                # an empty sequence
    (_packed(_i32(1, 2), _i32(3)), "tokens.lengths"),                      # sum != T
    (_packed(_i32(1, 2), _i32(-1, 3)), "tokens.lengths"),                  # negative length
    (_packed(_i32(1, 2), _i32(2**31 - 1, 2**31 - 1, 4)), "tokens.lengths"),  # sum wraps int32
    (_packed(_i32(1, 2), _i32(2), _i32(0)), "tokens.token_type_ids"),      # types != T
])
def test_malformed_tokens_raise_invalid_input_naming_the_field(message, field):
    with pytest.raises(InvalidInput) as info:
        wire.unpack_tokens(message)
    assert info.value.field == field


def test_pack_checks_the_same_invariants():
    with pytest.raises(InvalidInput, match="add up to 2"):
        wire.pack_tokens(ragged.RaggedBatch(np.array([1, 2, 3], np.int32), np.array([0, 2], np.int32)))


@pytest.mark.parametrize("dtype, wire_dtype", [("float32", inference_pb2.DTYPE_FLOAT32),
                                               ("float16", inference_pb2.DTYPE_FLOAT16)])
def test_tensor_round_trip(dtype, wire_dtype):
    array = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
    tensor = inference_pb2.Tensor.FromString(wire.array_to_tensor(array, dtype).SerializeToString())
    assert tensor.dtype == wire_dtype and list(tensor.shape) == [3, 5]
    back = wire.tensor_to_array(tensor)
    assert back.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(back, array.astype(dtype))
    assert wire.array_to_tensor(array, wire_dtype) == tensor  # enum value or name


def test_tensor_with_wrong_size_or_dtype_is_rejected():
    tensor = wire.array_to_tensor(np.zeros((2, 4), np.float32))
    tensor.shape[:] = [2, 5]
    with pytest.raises(InvalidInput, match="needs 40"):
        wire.tensor_to_array(tensor)
    tensor = inference_pb2.Tensor(data=b"\x00" * 8, dtype=7, shape=[2])
    with pytest.raises(InvalidInput, match="DType"):
        wire.tensor_to_array(tensor)
    with pytest.raises(InvalidInput):
        wire.array_to_tensor(np.zeros(2), 7)


INFO = ModelInfo(model_id="tiny", architecture="BertModel", task="embed", dimension=32,
                 max_positions=512, vocab_size=250_002, pooling="mean", normalize=True,
                 prompts={"query": "query: "}, device="cuda:0", dtype="bfloat16")


def test_model_info_reply_carries_the_model_and_the_limits():
    reply = inference_pb2.InfoResponse.FromString(wire.model_info_to_proto(
        INFO, max_batch_tokens=512, max_batch_sequences=64, max_queue_tokens=4096,
        version="9.9").SerializeToString())
    assert (reply.model_id, reply.dimension, reply.max_positions, list(reply.tasks)) == (
        "tiny", 32, 512, ["embed"])
    assert (reply.device, reply.dtype, reply.version) == ("cuda:0", "bfloat16", "9.9")
    assert (reply.max_batch_tokens, reply.max_batch_sequences, reply.max_queue_tokens) == (512, 64, 4096)


def test_model_info_from_a_reply_keeps_what_only_the_directory_says():
    described = ModelInfo(**{**INFO.__dict__, "model_id": "dir-name", "device": None, "dtype": None})
    reply = wire.model_info_to_proto(INFO, max_batch_tokens=1, max_batch_sequences=1,
                                     max_queue_tokens=1, version="")
    assert wire.model_info_from_proto(reply, described) == INFO
    unnamed = inference_pb2.InfoResponse(device="cpu", dtype="float32")
    merged = wire.model_info_from_proto(unnamed, described)
    assert (merged.model_id, merged.device, merged.dtype) == ("dir-name", "cpu", "float32")
