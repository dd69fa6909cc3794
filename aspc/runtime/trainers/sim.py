"""The ``sim`` trainer: each step takes ``train_base + train_per_token·tokens`` simulated seconds.

It declares a virtual clock, like the ``sim`` backend
(:mod:`aspc.runtime.backends.sim`), and publishes no weights.
"""

from __future__ import annotations

from aspc.runtime.backends.sim_cost import SimCostModel
from aspc.runtime.contracts import Clock, TrainBatch, Trainer, TrainResult


class SimTrainer(Trainer):
    """A trainer whose step takes ``train_base + train_per_token·tokens`` simulated seconds."""

    clock = Clock.VIRTUAL

    def __init__(self, cost: SimCostModel):
        self.cost = cost  # α and β of the trainer step

    def known_step_cost(self) -> tuple[float, float] | None:
        """(α, β): every step costs ``α + β·tokens``; ``None`` for a subclass whose ``step`` may differ."""
        # The bound method, not the class's: a step patched on the instance (a test's failing trainer) counts too.
        if getattr(self.step, "__func__", None) is not _STEP_AS_DEFINED:
            return None
        return self.cost.train_base, self.cost.train_per_token

    def step(self, batch: TrainBatch) -> TrainResult:
        tokens = float(batch.response_len.sum() + batch.prompt_tokens.sum())
        return TrainResult(
            version=batch.step + 1, elapsed=self.cost.train_base + self.cost.train_per_token * tokens
        )


# A subclass or a patch that replaces step (a test's) makes the run go event by event.
_STEP_AS_DEFINED = SimTrainer.step
