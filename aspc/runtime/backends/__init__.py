"""Generation backends: ``sim`` (the simulator) and the real ``hf`` (transformers) and ``vllm`` (vLLM / vLLM-Ascend).

The real ones hold one model per worker (:class:`~aspc.runtime.backends.base.ModelBackend`),
take their options from ``BackendContext.options`` (see
:mod:`aspc.runtime.backends.options`), and run under the local engine
(threads) or the Ray engine (one actor per worker). Their heavy imports
(torch, transformers, vllm) happen inside the backend modules, when a backend
is built by :func:`aspc.runtime.registry.make_backend`.
"""
