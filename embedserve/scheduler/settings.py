"""The scheduler's settings: one frozen dataclass, built at the entry point.

``embedserve scheduler`` (``cli.py``) builds it from flags; tests build it
directly. Nothing here reads argv or the environment.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from embedserve.model.cuda_options import ATTENTION_CHOICES, CudaOptions
from embedserve.model.probe_texts import DEFAULT_PROBE_MIN_COSINE
from embedserve.tracing import TracingSettings

# Token budget per step when the flag is not given. On a GPU, 512 keeps a
# CUDA-graph bucket busy without long waits. On CPU the budget was chosen by
# measurement (bench/scheduler_bench.py part (d), BENCHMARKS.md): on the
# default model, Engine.step's tokens/s rises up to ~512 tokens and does not
# rise beyond (it fell at 1024 and 2048), while a bigger step makes a query
# arriving behind it wait longer. So 512 on CPU too, for its own reason.
GPU_MAX_BATCH_TOKENS = 512
CPU_MAX_BATCH_TOKENS = 512
# bf16 on CPU (what --dtype auto runs where the CPU has AMX or AVX512-BF16) is not
# fp32: with the native kernels a 1024-token step runs 33-49 % more tokens/s than a
# 512-token one (fp32: 3-10 %), for ~35 ms more wait behind a step (BENCHMARKS.md,
# scheduler section, the bf16 re-run of the sweep).
CPU_BF16_MAX_BATCH_TOKENS = 1024
# The engine dtypes a replica accepts (``--dtype``; embedserve.engine.engine.DTYPES
# and auto, embedserve/engine/dtype_choice.py), spelled here so entry points can
# offer them without importing torch. auto is the default.
REPLICA_DTYPES = ("auto", "float32", "bfloat16", "float16", "int8")
# The priority classes (docs/priority.md): while interactive work is queued (in
# the step or waiting) or arrived within the window, a step carries at most this
# many batch tokens (plus the one batch sequence every step takes). Chosen by
# measurement (``python -m bench priority``, docs/priority.md): with no window,
# only the steps that carry queries are small, and a bulk job keeps its full-size
# steps in between (in bf16 on a 2-core CPU a 1024-token step runs ~1.75x the
# tokens/s of a 256-token one); with a window every step is bounded, which
# shortens the wait behind a step but cost the bulk job 30-45 % of its rate.
# Both apply where steps are not preempted (CUDA, or --no-preempt-batch-steps):
# with preemption the classes never share a step and batch steps run at the full budget.
BATCH_TOKENS_WHILE_INTERACTIVE = 128
INTERACTIVE_WINDOW_S = 0.0
# Where the engine can (CPU), an interactive step runs between two layers of the batch
# step being computed (engine/runners/preemption.py, scheduler/batcher.py).
PREEMPT_BATCH_STEPS = True
# How much nicer a replica's CPU lanes (its batch steps, with priority classes) run than
# the rest of it: the gateway, the replica's event loop and the interactive steps' thread
# get a core first when they want one (docs/priority.md, "Lanes": against 0, an
# interactive query's p50 during a bulk job was 1.70x idle, over the target's 1.5x).
REPLICA_LANE_NICE = 10
# The threads a replica's steps of few tokens (the flat loop, engine/small_steps.py) run
# on. A replica runs OpenMP teams on several threads (its event loop, the lanes, the
# urgent thread), so libgomp lets each worker spin only ~100 turns before it sleeps on a
# futex, and every region of a step wakes it through the kernel: a 6-token step spent
# more waking its second thread than it saved (AMD EPYC family 26, against two threads
# in the same run: inference p50 4.6 -> 2.7 ms for queries back to back, 4.7 -> 3.9 ms
# for one every 50 ms; BENCHMARKS.md, docs/engine.md). Larger steps keep every core.
REPLICA_SMALL_STEP_THREADS = 1
DEFAULT_DTYPE = "auto"


@dataclass(frozen=True)
class SchedulerSettings:
    model_dir: Path
    host: str = "127.0.0.1"
    port: int = 0                        # 0: pick a free port (tests)
    metrics_port: int | None = None      # None: no metrics endpoint; 0: pick a free port
    # Also listen on this Unix domain socket: a gateway on the same machine
    # (``embedserve serve``) calls through it, without TCP loopback's per-call
    # cost. The TCP port stays open for remote gateways and probes.
    unix_socket: Path | None = None
    # The same frame calls on TCP, for a gateway on another machine (it learns the
    # port from Info): 0 picks a free port, None opens none.
    frame_port: int | None = 0
    device: str = "cpu"
    # auto: bfloat16 where the hardware runs it natively and the load-time probe
    # agrees with float32 (min cosine >= dtype_probe_min_cosine), else float32.
    dtype: str | None = DEFAULT_DTYPE
    dtype_probe_min_cosine: float = DEFAULT_PROBE_MIN_COSINE
    cuda_graphs: bool = True             # CUDA only: replay captured graphs per bucket (off: eager)
    # CUDA only: the attention kernel, the graph cache's bounds (None: every
    # reachable bucket, no byte cap) and capturing before SERVING (model/cuda_options.py).
    cuda_attention: str = "auto"
    max_graphs: int | None = None
    graph_memory_mib: int | None = None
    capture_at_start: bool = False
    # None: default_max_batch_tokens for the device and the dtype the engine loads in.
    max_batch_tokens: int | None = None
    max_batch_sequences: int = 256
    max_queue_tokens: int = 65536        # backpressure bound (tokens waiting for a batch)
    in_flight_depth: int = 2             # engine steps submitted and not finished
    # Priority classes (docs/priority.md): the batch tokens a step may carry while
    # interactive work is queued or arrived less than interactive_window_s ago.
    batch_tokens_while_interactive: int = BATCH_TOKENS_WHILE_INTERACTIVE
    interactive_window_s: float = INTERACTIVE_WINDOW_S
    preempt_batch_steps: bool = PREEMPT_BATCH_STEPS
    # CPU steps computed side by side (engine/runners/thread_share.py); None: the engine's default.
    cpu_lanes: int | None = None
    drain_timeout_s: float = 25.0        # SIGTERM: longest wait (under the usual 30 s kill grace)
    # RPCs handled at once (gRPC answers RESOURCE_EXHAUSTED beyond it). With
    # the message size derived from max_queue_tokens, this bounds the memory
    # held by requests that have arrived but not yet been admitted.
    max_concurrent_rpcs: int = 1024
    # Frame connections open at once (embedserve.link.frame_server); a gateway holds one per replica.
    max_frame_connections: int = 64
    # Where the int8/uint8 calibration is read, or computed at start-up and
    # stored (embedserve/calibration.py); None: none, Embed refuses int8/uint8.
    calibration_cache_dir: Path | None = None
    # Calls must carry ``authorization: Bearer <replica_token>`` (embedserve.link.auth);
    # None: no check. Kept out of repr so logs never show it.
    replica_token: str | None = field(default=None, repr=False)
    # OpenTelemetry export (docs/tracing.md); None: no tracing, nothing of it loaded.
    tracing: TracingSettings | None = None

    def __post_init__(self) -> None:
        for name in ("max_batch_tokens", "max_batch_sequences", "max_queue_tokens",
                     "in_flight_depth", "max_concurrent_rpcs", "max_frame_connections", "max_graphs",
                     "graph_memory_mib", "batch_tokens_while_interactive"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.interactive_window_s < 0:
            raise ValueError(f"interactive_window_s must be >= 0, got {self.interactive_window_s}")
        if not 0.0 <= self.dtype_probe_min_cosine <= 1.0:
            raise ValueError(f"dtype_probe_min_cosine must be in [0, 1], "
                             f"got {self.dtype_probe_min_cosine}")
        if self.cuda_attention not in ATTENTION_CHOICES:
            raise ValueError(f"cuda_attention must be one of {ATTENTION_CHOICES}, "
                             f"got {self.cuda_attention!r}")

    def cuda_options(self) -> CudaOptions:
        """The CUDA runner's options: graphs for every step the budget allows."""
        return CudaOptions(attention=self.cuda_attention,
                           graph_tokens=self.max_batch_tokens or default_max_batch_tokens(self.device),
                           graph_sequences=self.max_batch_sequences, max_graphs=self.max_graphs,
                           graph_memory_bytes=None if self.graph_memory_mib is None
                           else self.graph_memory_mib << 20,
                           capture_at_start=self.capture_at_start)


def default_max_batch_tokens(device: str, dtype: str | None = None) -> int:
    """The step token budget when none is given; ``dtype``: the engine's, once loaded."""
    if device.startswith("cuda"):
        return GPU_MAX_BATCH_TOKENS
    # int8 not measured for the budget: it keeps float32's
    return CPU_BF16_MAX_BATCH_TOKENS if dtype == "bfloat16" else CPU_MAX_BATCH_TOKENS
