"""The ``sim`` backend: a cost model and a discrete-event driver on a virtual clock."""

from aspc.runtime.sim.backend import SimBackend, SimTrainer, minibatch_times
from aspc.runtime.sim.cost import (
    COST_MODEL_KEYS,
    CostModel,
    cost_model_from_dict,
    load_cost_model,
    save_cost_model,
)
from aspc.runtime.sim.engine import VirtualClockEngine

__all__ = [
    "COST_MODEL_KEYS",
    "CostModel",
    "SimBackend",
    "SimTrainer",
    "VirtualClockEngine",
    "cost_model_from_dict",
    "load_cost_model",
    "minibatch_times",
    "save_cost_model",
]
