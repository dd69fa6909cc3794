"""Predicted cost of a generation minibatch.

A worker returns a minibatch only when its longest sequence is done, so a
minibatch of ``s`` sequences costs about ``s * L_max`` token-slots (the
padding view of DESIGN.md). With uncertain predictions the right ``L_max`` is
the expected *maximum* of the minibatch's sampled lengths, not the maximum of
their means: ``expected-max`` models each prompt's length as a lognormal fitted
to its (q10, q50, q90) and integrates ``E[max] = ∫ 1 - Π F_i(x)^{n_i} dx``.
"""

from aspc.costs.minibatch import MINIBATCH_COSTS, minibatch_costs

__all__ = ["MINIBATCH_COSTS", "minibatch_costs"]
