"""Generated gRPC stubs for ``protos/embedserve/v1`` (do not edit the ``*_pb2*`` files).

Import them as ``from embedserve.protos import inference_pb2, inference_pb2_grpc``.
Regenerate with ``python -m embedserve.protos.generate``; a test fails when
they are stale. The codec for the packed fields is ``embedserve.link.wire``.
"""

from embedserve.protos import inference_pb2, inference_pb2_grpc

__all__ = ["inference_pb2", "inference_pb2_grpc"]
