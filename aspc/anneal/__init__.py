"""Grouping minibatches into equal-work groups, and their dispatch order.

The sorting bubble: dispatching length-sorted minibatches short first floods
the trainer's queue early and starves it later. :func:`balance` arranges
minibatches into groups of near-equal predicted work; :func:`dispatch_order`
sends them group by group so cumulative work tracks cumulative samples.
"""

from aspc.anneal.balance import BalanceResult, balance, default_iterations
from aspc.anneal.lpt import lpt_keys, lpt_order, max_quantiles
from aspc.anneal.order import delivery_drift, dispatch_order, group_order

__all__ = [
    "BalanceResult",
    "balance",
    "default_iterations",
    "delivery_drift",
    "dispatch_order",
    "group_order",
    "lpt_keys",
    "lpt_order",
    "max_quantiles",
]
