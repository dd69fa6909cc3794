"""Trainers, all in one place: ``sim`` (cost-model step times), ``grpo`` (a GRPO trainer for causal
LMs) and ``user`` (the ``--trainer module:factory`` loader, the only import of user code).

Built by name in :func:`aspc.runtime.registry.make_trainer`.
"""
