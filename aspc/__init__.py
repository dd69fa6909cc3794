"""aspc: an offline schedule compiler for LLM reinforcement learning.

Implements the Adaptive Scheduling Pipeline (predict, partition, anneal,
order, emit) and a thin runtime that executes the resulting plan.
"""

__version__ = "0.1.0"
