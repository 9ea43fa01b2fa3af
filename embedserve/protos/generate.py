"""Regenerate the gRPC stubs in this package from ``protos/`` (grpcio-tools).

Run ``python -m embedserve.protos.generate`` from a source checkout after
editing a ``.proto`` file. The stubs are committed (grpcio-tools is a test
dependency, not a runtime one); ``tests/test_wire_stubs.py`` regenerates them
into a temporary directory and fails if they differ from the committed ones.

protoc names the grpc module's import after the proto's path
(``from embedserve.v1 import inference_pb2``); we keep that path, because
server reflection and ``grpcurl`` report it, and rewrite only the Python
import so the stubs live inside ``embedserve.protos``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
PROTO_ROOT = PACKAGE_DIR.parent.parent / "protos"
PROTO_FILES = ("embedserve/v1/inference.proto", "embedserve/v1/embeddings.proto")
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def generated_names(proto_file: str) -> list[str]:
    """The file names protoc writes for one .proto (flattened into this package)."""
    stem = Path(proto_file).stem
    return [stem + suffix for suffix in GENERATED_SUFFIXES]


def generate(out_dir: Path, proto_root: Path = PROTO_ROOT) -> list[Path]:
    """Write the stubs for PROTO_FILES into ``out_dir``; return the paths written."""
    from grpc_tools import protoc  # a test/dev dependency, imported only here

    written: list[Path] = []
    with tempfile.TemporaryDirectory() as tmp:
        args = ["grpc_tools.protoc", f"-I{proto_root}", f"--python_out={tmp}",
                f"--pyi_out={tmp}", f"--grpc_python_out={tmp}", *PROTO_FILES]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed on {PROTO_FILES} under {proto_root}")
        for proto_file in PROTO_FILES:
            proto_module = proto_file[: -len(".proto")].replace("/", ".")  # embedserve.v1.inference
            package, _, stem = proto_module.rpartition(".")
            for name in generated_names(proto_file):
                text = (Path(tmp) / Path(proto_file).parent / name).read_text()
                text = text.replace(f"from {package} import {stem}_pb2",
                                    f"from embedserve.protos import {stem}_pb2")
                target = out_dir / name
                target.write_text(text)
                written.append(target)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=PACKAGE_DIR,
                        help="where to write the stubs (default: this package)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for path in generate(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
