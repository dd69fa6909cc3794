"""Minibatch boundaries over length-sorted prompts (the padding bubble).

A worker returns a generation minibatch only when its longest response is
done, so every sequence in it costs as much as the longest. Grouping prompts of
similar predicted length, and letting minibatch sizes flex by a small slack so
that boundaries can fall at jumps in length, minimises that padding.
"""

from aspc.partition.boundaries import padded_cost, partition

__all__ = ["padded_cost", "partition"]
