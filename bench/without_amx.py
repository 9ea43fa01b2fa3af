"""Time an AVX-512 host without AMX (AMD Zen 4's paths: AVX512-BF16 and VNNI) on one that
has it.

``hide_amx()``, called before torch is imported, caps oneDNN at AVX512_CORE_BF16
(``ONEDNN_MAX_CPU_ISA``, read when oneDNN first runs) and makes torch report no AMX tiles,
the one test every engine kernel takes its AMX path by (bf16_attention.available_paths,
amx_linear and int8_linear's tiles through it, bf16_linear's "no AMX" directly). The
arithmetic then runs on the instructions such a host has; their speed is this core's, not
that host's (Zen 4 runs 512-bit operations in two halves), so a ratio measured this way
says where the code stands, not what that host will read.
"""

from __future__ import annotations

import argparse
import os
import sys

ONEDNN_ISA = "AVX512_CORE_BF16"


def hide_amx() -> None:
    """Run this process as if its CPU had no AMX (module docstring). Before torch loads."""
    if "torch" in sys.modules:
        raise RuntimeError("hide_amx() must run before torch is imported (oneDNN reads its ISA cap once)")
    os.environ["ONEDNN_MAX_CPU_ISA"] = ONEDNN_ISA
    import torch

    torch.cpu._is_amx_tile_supported = lambda: False


def add_option(parser: argparse.ArgumentParser) -> None:
    """A bench's ``--without-amx`` flag; ``apply(args)`` acts on it."""
    parser.add_argument("--without-amx", action="store_true",
                        help="on a CPU with AMX, run the paths of one without (AMD Zen 4's: AVX512-BF16 "
                             "and VNNI): bench/without_amx.py")


def apply(args: argparse.Namespace) -> None:
    """``hide_amx()`` where ``--without-amx`` was given (before the bench imports torch)."""
    if args.without_amx:
        hide_amx()
