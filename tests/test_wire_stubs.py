"""The committed gRPC stubs in embedserve/protos must match protos/*.proto."""

from __future__ import annotations

from pathlib import Path

from embedserve.protos import generate


def test_generated_stubs_are_up_to_date(tmp_path: Path):
    written = generate.generate(tmp_path)
    assert written, "protoc wrote nothing"
    stale = [path.name for path in written
             if path.read_text() != (generate.PACKAGE_DIR / path.name).read_text()]
    assert not stale, (f"stubs out of date with protos/: {stale}; "
                       "run `python -m embedserve.protos.generate`")


def test_stubs_import_from_the_package_and_serve_the_contract():
    from embedserve.protos import inference_pb2, inference_pb2_grpc

    service = inference_pb2.DESCRIPTOR.services_by_name["Inference"]
    assert service.full_name == "embedserve.v1.Inference"
    assert sorted(m.name for m in service.methods) == ["Classify", "Embed", "EmbedSparse", "EmbedTokens",
                                                       "Info", "Ranges", "Score"]
    assert hasattr(inference_pb2_grpc, "InferenceStub")


def test_public_api_stubs_import_from_the_package_and_serve_the_contract():
    from embedserve.protos import embeddings_pb2, embeddings_pb2_grpc

    service = embeddings_pb2.DESCRIPTOR.services_by_name["Embeddings"]
    assert service.full_name == "embedserve.v1.Embeddings"
    assert sorted(m.name for m in service.methods) == ["Classify", "Embed", "EmbedSparse", "EmbedStream",
                                                        "EmbedTokens", "Info", "Rerank", "Tokenize"]
    stream = service.methods_by_name["EmbedStream"]
    assert stream.client_streaming and stream.server_streaming
    assert hasattr(embeddings_pb2_grpc, "EmbeddingsStub")
