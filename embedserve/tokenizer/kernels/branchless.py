"""A select the compiler keeps branch-free, for choices the data makes at random.

LLVM turns ``a if cond else b`` into a conditional branch where it guesses a branch is
cheaper (x86's cmov-to-branch pass does so inside loops whose comparison reads memory).
When the condition is as good as random, as Viterbi's "does this candidate beat the
best so far" is on text never seen before, the branch mispredicts about half the time
(~15-20 cycles each). ``unpredictable_select`` emits the select with LLVM's
``!unpredictable`` metadata, which tells every backend to keep it a conditional move.
"""

from __future__ import annotations

from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic


@intrinsic
def unpredictable_select(typingctx, cond, if_true, if_false):
    """``if_true if cond else if_false`` (both of one type), compiled without a branch."""
    if if_true != if_false or not isinstance(cond, (types.Boolean, types.Integer)):
        return None

    def codegen(context, builder, signature, args):
        flag = args[0]
        if flag.type != ir.IntType(1):
            flag = builder.icmp_unsigned("!=", flag, ir.Constant(flag.type, 0))
        chosen = builder.select(flag, args[1], args[2])
        chosen.set_metadata("unpredictable", builder.module.add_metadata([]))
        return chosen
    return if_true(cond, if_true, if_false), codegen
