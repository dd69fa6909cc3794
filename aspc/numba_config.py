"""Numba flags for every aspc kernel, in one place.

``cache=True`` writes compiled machine code next to the module so a warm
``aspc compile`` pays no JIT cost. ``fastmath`` stays off: the kernels compare
floating costs for exact ties and must give the same plan on every machine.
Set ``NUMBA_DISABLE_JIT=1`` to run kernels as plain Python (coverage, debug).
"""

NJIT_FLAGS = {"cache": True, "fastmath": False, "nogil": True}

# For kernels whose outer loop has independent iterations (one minibatch
# each, no reductions across them): results do not depend on thread count.
NJIT_PARALLEL_FLAGS = {**NJIT_FLAGS, "parallel": True}
