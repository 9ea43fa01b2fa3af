"""The replica link: everything that crosses from a gateway to a replica, in one place.

Both ends import it; it imports neither (``.importlinter``). Modules, one job each:

    wire.py          the codec: RaggedBatch <-> PackedTokens, arrays <-> Tensor,
                     ModelInfo <-> InfoResponse, precision and priority names
    frames.py        the frame envelope: header (magic, version), method table, reader
    frame_client.py  the gateway's end of a frame connection (FrameChannel)
    frame_keeper.py  the gateway's channel to one replica, kept open while it serves
    frame_server.py  the replica's end (FrameServer), serving the replica's handlers
    auth.py          the replica token in gRPC metadata (TokenAuthInterceptor)
    token_file.py    the token on disk and ``--replica-token-file`` (no grpc import)
    status.py        the one error table: embedserve errors -> a gRPC status and back
    addresses.py     how a replica's address is written (host:port, unix:PATH)

The messages are ``embedserve.v1`` protobufs (``embedserve.protos``, generated from
protos/embedserve/v1/inference.proto); docs/replica-link.md describes the protocol.
Importing this package imports none of its modules (``embedserve --help`` reads
token_file.py without grpc).
"""
