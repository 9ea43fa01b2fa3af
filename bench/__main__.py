"""``python -m bench NAME [ARGS...]`` (from the repository root): run one benchmark's ``main(argv)``.

To add a benchmark, give its module a ``main(argv: list[str] | None) -> int`` and list
it in ``BENCHMARKS``. The benchmarks live in the repository, not in the installed
package: they need the reference peers and data that only a checkout has.
"""

from __future__ import annotations

import argparse
import importlib
import sys

BENCHMARKS = {
    "tokenizer": "bench.tokenizer_bench",
    "tokenizer_ab": "bench.tokenizer_ab",
    "engine": "bench.engine_bench",
    "engine_profile": "bench.engine_profile",
    "modernbert": "bench.modernbert_bench",
    "mpnet": "bench.mpnet_bench",
    "llm_reranker": "bench.llm_reranker_bench",
    "decoder": "bench.decoder_bench",
    "gateway": "bench.gateway_bench",
    "gateway_memory": "bench.gateway_memory",
    "soak": "bench.soak",
    "engine_memory": "bench.engine_memory",
    "overhead": "bench.overhead_bench",
    "concurrency_ab": "bench.concurrency_ab",
    "grpc_transport": "bench.grpc_transport",
    "suite": "bench.suite.cli",
    "bulk": "bench.bulk_bench",
    "quantized_recall": "bench.quantized_recall",
    "dtype_load": "bench.dtype_load",
    "startup": "bench.startup",
    "tokenizer_compile": "bench.tokenizer_compile",
    "native_kernels": "bench.native_kernels",
    "native_linears": "bench.native_linears",
    "gpu": "bench.gpu.workloads",
    "priority": "bench.priority_bench",
    "priority_toggle": "bench.priority_toggle",
    "serve_ab": "bench.serve_ab",
    "short_query": "bench.short_query",
    "int8": "bench.int8_bench",
    "int8_few_rows": "bench.int8_few_rows",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("name", choices=sorted(BENCHMARKS), help="which benchmark")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the benchmark")
    args = parser.parse_args(argv)
    module = importlib.import_module(BENCHMARKS[args.name])
    return int(module.main(args.args) or 0)


if __name__ == "__main__":
    sys.exit(main())
