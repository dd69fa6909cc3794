"""The ``ray`` engine: each generation worker is a Ray actor holding its own model.

The dispatcher, bounded queue and trainer stay in the driver (the same
:class:`~aspc.runtime.core.scheduler.Scheduler` and run loop as every other
engine); only generation moves into actors. This is the only module that
imports ``ray``.

- **Actors.** Worker ``w`` is an actor built from
  :meth:`~aspc.runtime.backends.base.ModelBackend.worker_copy`. All W actors are
  started, and their models loaded, during the backend's setup; the engine's
  clock restarts once they are ready. Each asks Ray for one GPU (or an
  ``NPU`` custom resource) when the cluster has them, else for a CPU
  (fractions when there are fewer devices than workers, so a run never waits
  for resources that do not exist).
- **Calls.** One remote call per minibatch carries the reload (if the
  scheduler decided one) and the request, so a reload can only happen
  between two minibatches of that worker. Published state dicts are put in
  Ray's object store once per version and shared by every actor.
- **Faults.** An actor that dies mid-minibatch (process killed, node lost)
  raises ``RayActorError`` in the driver. Nothing of that minibatch has been
  reported, so it is a worker fault like any other: the minibatch goes back
  to the dispatcher, which hands it out again (``--max-retries`` bounds how
  often), and every sample is still generated once and returned once. The
  dead actor's slot gets a fresh actor at its next dispatch, which first
  reloads the weights version the scheduler believes that worker holds.
- **Runs in a row.** A backend kept open across runs (the epochs of ``aspc
  run --epochs``, a scout before them) keeps its actors, as the local engine
  keeps its models: the next run's engine takes them over
  (:meth:`~aspc.runtime.backends.base.ModelBackend.keep_remote`), so each
  model loads once, and the backend's ``close`` stops them. A trainer carried
  over from the previous run hands its current weights to every actor as
  version 0 (:meth:`RayEngine.load_start_weights`); a replacement actor
  reloads them.
- **Clock.** Timestamps are the driver's wall clock; a minibatch's generation
  start is its end minus the generation time the actor measured, so transfer
  latency and a replacement actor's start-up count as reload time, not
  generation time.

Connects to the cluster in ``RAY_ADDRESS`` if set, else starts a local Ray
instance (and shuts it down at the end; should this process die first,
:mod:`.ray_reaper` ends what Ray's own fate-sharing leaves). A Ray session
that is already initialised is used as is and left running.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Iterator
from typing import Any

from aspc import interrupt_libraries
from aspc.errors import AspcError, BackendError, ConfigError, RunError, short_reason
from aspc.runtime.backends.base import GenerationRequest, ModelBackend
from aspc.runtime.config import ReturnMode
from aspc.runtime.contracts import Clock, GenerationBackend, GenerationResult, Trainer
from aspc.runtime.core.events import Event
from aspc.runtime.core.scheduler import Dispatch
from aspc.runtime.engines import ray_reaper
from aspc.runtime.engines.threads import ThreadEngine
from aspc.runtime.work import MinibatchWork

RAY_EXTRA = "pip install 'aspc[ray]'"


def check_reachable(address: str | None, timeout: float = 10.0) -> None:
    """Raise ``ConnectionError`` when a ``host:port`` Ray address takes no TCP connection.

    ``ray.init`` waits minutes on an address nothing listens at (GCS
    reconnect timeouts) with nothing on the console; one plain connect
    answers in milliseconds, or ``timeout`` seconds for a dropped packet.
    ``auto``, ``local`` and malformed addresses are left to ``ray.init``.
    """
    if not address:
        return
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not host or not port.isdigit():
        return
    import socket

    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as exc:
        raise ConnectionError(f"nothing answers at {host}:{port}: {exc.strerror or exc}") from None


def import_ray() -> Any:
    """``import ray``, or a :class:`BackendError` that says how to install it."""
    try:
        import ray
    except ImportError:
        raise BackendError(f"--engine ray needs Ray, which is not installed; {RAY_EXTRA}") from None
    return ray


class WorkerActor:
    """The body of one worker actor (wrapped with ``ray.remote`` by :class:`RayEngine`)."""

    def __init__(self, backend: ModelBackend, worker: int):
        self.backend = backend  # a worker_copy: serves only ``worker``
        self.worker = worker
        backend.start_worker(worker)

    def run(self, reload: tuple[int, Any] | None, request: GenerationRequest) -> tuple[float, GenerationResult]:
        """Reload weights if asked, then generate ``request``; returns (reload seconds, result)."""
        seconds = 0.0 if reload is None else self.load(reload)
        return seconds, self.backend.execute(self.worker, request)

    def run_streaming(self, reload: tuple[int, Any] | None, request: GenerationRequest) -> Iterator[tuple[Any, ...]]:
        """``run`` for ``--return-mode continuous``: yields ``("samples", positions, lens, payload)`` as each
        request ends, then ``("done", reload seconds, result)`` (a Ray streaming generator)."""
        seconds = 0.0 if reload is None else self.load(reload)
        ended: queue.Queue[tuple[Any, ...] | None] = queue.Queue()
        out: dict[str, Any] = {}

        def generate() -> None:  # the backend calls back from inside generation; the generator yields here
            try:
                out["result"] = self.backend.execute_streaming(
                    self.worker, request, lambda pos, lens, payload: ended.put(("samples", pos, lens, payload)))
            except BaseException as exc:  # re-raised below, in the actor's call
                out["error"] = exc
            finally:
                ended.put(None)

        thread = threading.Thread(target=generate, daemon=True)
        thread.start()
        while (item := ended.get()) is not None:
            yield item
        thread.join()
        if "error" in out:
            raise out["error"]
        yield ("done", seconds, out["result"])

    def load(self, reload: tuple[int, Any]) -> float:
        """Load weights ``(version, handle)`` into this worker's model; returns the seconds it took."""
        import ray

        version, weights = reload
        if isinstance(weights, ray.ObjectRef):
            weights = ray.get(weights)
        return self.backend.load_weights(self.worker, version, weights)

    def pid(self) -> int:
        """The actor's process id (lets tests and operators find it)."""
        return os.getpid()

    def speed_probe(self) -> float:
        """Seconds this worker takes for the backend's reference generation (``--speed-probe``)."""
        return self.backend.speed_probe(self.worker)

    def check_prompts(self, work: Any, max_new_tokens: int) -> dict[str, int] | None:
        """Refuse the plan's prompts this worker's model cannot take (the backend's check); their token counts."""
        return self.backend.check_prompts(self.worker, work, max_new_tokens)


class RayEngine(ThreadEngine):
    """Generation in Ray actors, the trainer in a driver thread; see the module docstring.

    Parameters
    ----------
    backend
        A :class:`~aspc.runtime.backends.base.ModelBackend` (``hf`` or ``vllm``);
        the driver's copy loads no model.
    trainer
        Runs in the driver, as with the local engine.
    return_mode
        ``static``, or ``continuous`` with a streaming backend (vllm): each
        actor streams its samples as they end (:meth:`WorkerActor.run_streaming`).
    worker_timeout
        Wall seconds a minibatch call may take before it is abandoned (as
        with the local engine).
    init_kwargs
        Extra ``ray.init`` arguments when this engine starts Ray itself.
    """

    def __init__(
        self,
        backend: GenerationBackend,
        trainer: Trainer,
        return_mode: ReturnMode,
        *,
        worker_timeout: float | None = None,
        init_kwargs: dict[str, Any] | None = None,
    ):
        if backend.clock is Clock.VIRTUAL:
            raise ConfigError("the sim backend runs on the local engine; drop --engine ray or pick a real backend")
        if not isinstance(backend, ModelBackend):
            raise ConfigError("--engine ray runs the hf and vllm backends (workers need a model per actor)")
        super().__init__(backend, trainer, return_mode, worker_timeout=worker_timeout)
        ray = import_ray()
        self._ray = ray
        self._owns_ray = False
        self._actors: dict[int, Any] = {}  # worker -> actor handle
        kept = backend.take_remote()
        if kept is not None and ray.is_initialized():  # the previous run's actors: their models are loaded
            self._actors, self._owns_ray = dict(kept[0]), kept[1]
        if not ray.is_initialized():
            try:
                check_reachable((init_kwargs or {}).get("address") or os.environ.get("RAY_ADDRESS"))
                # Ray's INFO and WARNING lines at start ("Using address ...", the token-authentication
                # notice of every local start) would share the console aspc owns; its errors still show.
                quiet = {"include_dashboard": False, "log_to_driver": False, "logging_level": logging.ERROR}
                before = ray_reaper.children(os.getpid())
                with interrupt_libraries.kept():  # ray.init installs a SIGTERM handler of its own
                    interrupt_libraries.no_ray_failure_handler(ray)
                    ray.init(**{**quiet, **(init_kwargs or {})})
                # A kill -9 of this process leaves the raylet's agents alive for a minute: see ray_reaper.
                ray_reaper.watch(ray_reaper.children(os.getpid()) - before)
            except (ValueError, OSError, RuntimeError) as exc:  # a malformed RAY_ADDRESS was a traceback
                where = os.environ.get("RAY_ADDRESS")
                raise ConfigError(f"--engine ray: cannot start or reach Ray{f' at RAY_ADDRESS={where}' if where else ''} "
                                  f"({short_reason(exc, limit=120)}); fix RAY_ADDRESS, or unset it for a local "
                                  "Ray") from None  # fmt: skip
            self._owns_ray = True
        self.model_backend = backend
        self._last: dict[int, tuple[int, Any]] = {}  # worker slot -> (version, weights handle) last loaded
        self._fresh: set[int] = set()  # slots whose actor was replaced and holds the model's own weights again
        self._start: tuple[int, Any] | None = None  # the run's version 0 when not the model's own (load_start_weights)
        self._weights: tuple[int, Any] | None = None  # newest published (version, object-store handle)
        self._lock = threading.Lock()
        self.restarts = 0  # actors replaced after dying, over the whole run
        self.redispatched: list[int] = []  # minibatches handed back to the dispatcher after their actor died
        # The driver keeps no model: actors do, started when the backend is set up.
        backend.serve_remotely(self.start_actors, self.check_prompts)
        if backend.n_workers:  # already set up: start the actors now
            self.start_actors(backend.n_workers)

    # ---- actors ----------------------------------------------------------------

    def _actor_options(self) -> dict[str, Any]:
        resources = self._ray.cluster_resources()
        n = max(1, self.model_backend.n_workers)
        device = self.model_backend.options.device.split(":", 1)[0]
        if device in ("auto", "cuda") and resources.get("GPU", 0) > 0:
            return {"num_gpus": min(1.0, resources["GPU"] / n), "num_cpus": 0}
        if device in ("auto", "npu") and resources.get("NPU", 0) > 0:
            return {"resources": {"NPU": min(1.0, resources["NPU"] / n)}, "num_cpus": 0}
        return {"num_cpus": min(1.0, resources.get("CPU", 1) / n)}

    def _actor(self, worker: int) -> Any:
        with self._lock:
            actor = self._actors.get(worker)
            if actor is None:
                opts = self._actor_options()
                share = float(opts["num_gpus"]) if opts.get("num_gpus", 0) > 0 else None
                copy = self.model_backend.worker_copy(worker, device_share=share)
                cls = self._ray.remote(WorkerActor).options(max_restarts=0, **opts)
                actor = cls.remote(copy, worker)
                self._actors[worker] = actor
            return actor

    def start_actors(self, n_workers: int) -> None:
        """Create every worker's actor and wait until each has loaded its model.

        Runs during the backend's setup, so model loading is not generation
        time; the engine's clock restarts when the actors are ready.
        """
        ray = self._ray
        actors = [self._actor(w) for w in range(n_workers)]
        try:
            with interrupt_libraries.ours_again():  # a signal while ray.get waits comes out as a plain KeyboardInterrupt
                ray.get([a.pid.remote() for a in actors])
        except ray.exceptions.RayActorError as exc:
            raise BackendError(f"a Ray worker could not start: {_cause_line(exc)}") from None
        self.advance_clock(0.0)  # the run's clock starts once every model is loaded

    def check_prompts(self, work: Any, max_new_tokens: int) -> dict[str, int] | None:
        """The backend's check of every plan prompt against the model, run in worker 0's actor; their token counts."""
        try:
            with interrupt_libraries.ours_again():
                return self._ray.get(self._actor(0).check_prompts.remote(work, max_new_tokens))
        except self._ray.exceptions.RayActorError as exc:
            raise BackendError(f"Ray worker 0 died checking the plan's prompts: {_cause_line(exc)}") from None
        except self._ray.exceptions.RayTaskError as exc:
            raise _task_failure(exc, BackendError, "checking the plan's prompts failed on Ray worker 0") from None

    def actor(self, worker: int) -> Any:
        """The handle of ``worker``'s actor, if it was started."""
        with self._lock:
            return self._actors.get(worker)

    def _replace(self, worker: int, dead: Any) -> None:
        with self._lock:
            if self._actors.get(worker) is dead:
                del self._actors[worker]
                self._fresh.add(worker)
                self.restarts += 1
        try:
            self._ray.kill(dead)
        except Exception:  # already gone
            pass

    def _handle(self, version: int, weights: Any) -> Any:
        """What an actor receives for ``weights``: paths as they are, tensors via the object store."""
        if weights is None or isinstance(weights, (str, os.PathLike)):
            return weights if not isinstance(weights, os.PathLike) else os.fspath(weights)
        with self._lock:
            if self._weights is None or self._weights[0] != version:
                self._weights = (version, self._ray.put(weights))
            return self._weights[1]

    def load_start_weights(self, weights: Any, workers: int) -> None:
        """Every actor loads ``weights`` as version 0 before the run's first dispatch.

        A trainer carried over from an earlier run (``aspc run --epochs``, a
        scout before the epochs) hands its current weights on this way; the
        actors of this run were started from the model directory. A slot whose
        actor dies later gets a replacement that loads them again.
        """
        start = (0, self._handle(0, weights))
        actors = [self._actor(w) for w in range(workers)]
        try:
            with interrupt_libraries.ours_again():
                self._ray.get([a.load.remote(start) for a in actors])
        except self._ray.exceptions.RayActorError as exc:
            raise BackendError(f"a Ray worker could not load the trainer's weights: {_cause_line(exc)}") from None
        except self._ray.exceptions.RayTaskError as exc:
            raise _task_failure(exc, BackendError, "a Ray worker could not load the trainer's weights") from None
        with self._lock:
            self._start = start
            for w in range(workers):
                self._last[w] = start

    def speed_probe(self, worker: int) -> float:
        """The reference generation run in ``worker``'s actor, on the model it serves the run with."""
        try:
            with interrupt_libraries.ours_again():
                return float(self._ray.get(self._actor(worker).speed_probe.remote()))
        except self._ray.exceptions.RayActorError as exc:
            raise BackendError(f"the speed probe's Ray worker {worker} died: {_cause_line(exc)}") from None
        except self._ray.exceptions.RayTaskError as exc:
            raise _task_failure(exc, BackendError, f"the speed probe failed on Ray worker {worker}") from None

    # ---- engine ------------------------------------------------------------------

    def start_generation(self, action: Dispatch, work: MinibatchWork, weights: Any) -> None:
        t0 = self.now()
        request = self.model_backend.request(work)
        w, m = action.worker, work.index
        reload = None
        if action.reload_version == 0 and weights is None and self._start is not None:
            reload = self._start  # the run's version 0 is the carried weights, not the model directory's
        elif action.reload_version is not None:
            reload = (action.reload_version, self._handle(action.reload_version, weights))

        on_samples, early = self._samples_reporter(w, work)

        def job() -> list[Event]:
            seconds, res = self._call(w, m, action.weights_version, reload, request,
                                      on_samples if self.continuous else None)  # fmt: skip
            end = self.now()
            return self._finished(action, work, early, res, t0, max(t0, end - res.elapsed), end)

        self._spawn(job, w, m)  # an exception here is a worker fault: the minibatch is handed out again

    def _call(
        self, worker: int, minibatch: int, version: int, reload: tuple[int, Any] | None, request: GenerationRequest,
        on_samples: Any = None,
    ) -> tuple[float, GenerationResult]:
        ray = self._ray
        actor = self._actor(worker)
        call_reload = reload
        if call_reload is None and worker in self._fresh and (version > 0 or self._start is not None):
            # A replacement actor starts from the model's own weights: bring it back to
            # the version this minibatch was dispatched with (the run's start weights at 0).
            call_reload = self._last.get(worker, self._start)
        try:
            if on_samples is None:
                seconds, res = ray.get(actor.run.remote(call_reload, request))
            else:  # continuous: the actor streams each request's samples as it ends
                seconds, res = self._stream(actor, call_reload, request, on_samples)
        except ray.exceptions.RayActorError as exc:
            # Nothing of this minibatch was reported: the dispatcher hands it out
            # again (a worker fault, counted against --max-retries); this worker
            # slot gets a fresh actor at its next dispatch.
            self._replace(worker, actor)
            with self._lock:
                self.redispatched.append(minibatch)
            raise RunError(f"worker {worker}'s Ray actor died during minibatch {minibatch} "
                           f"({_cause_line(exc)})") from None
        except ray.exceptions.RayTaskError as exc:
            raise _task_failure(exc, RunError, f"worker {worker} failed on minibatch {minibatch}") from None
        with self._lock:
            self._fresh.discard(worker)
            if call_reload is not None:
                self._last[worker] = call_reload
        return seconds, res

    def _stream(self, actor: Any, reload: tuple[int, Any] | None, request: GenerationRequest,
                on_samples: Any) -> tuple[float, GenerationResult]:  # fmt: skip
        for ref in actor.run_streaming.options(num_returns="streaming").remote(reload, request):
            item = self._ray.get(ref)
            if item[0] == "done":
                return item[1], item[2]
            on_samples(*item[1:])
        raise RunError(f"minibatch {request.minibatch}'s Ray actor ended its stream without a result")

    def close(self, *, keep_workers: bool = False) -> None:
        with self._lock:
            actors = dict(self._actors)
            self._actors.clear()
        ray, owns = self._ray, self._owns_ray
        if keep_workers and actors:
            # The backend stays open for another run (--epochs): so do its actors, and the session they live in.
            self.model_backend.keep_remote((actors, owns), lambda: _stop(ray, list(actors.values()), owns))
            return
        _stop(ray, list(actors.values()), owns)


def _stop(ray: Any, actors: list[Any], owns_ray: bool) -> None:
    """Kill ``actors``, and shut Ray down if this process started it."""
    for a in actors:
        try:
            ray.kill(a)
        except Exception:  # already dead
            pass
    if owns_ray and ray.is_initialized():
        with interrupt_libraries.kept():  # absl's handler, where installed, is uninstalled to the default action
            ray.shutdown()
    if owns_ray:
        ray_reaper.release()


def _task_failure(exc: BaseException, error: type[AspcError], what: str) -> AspcError:
    """What to raise for a remote call that raised: an aspc error as it is, else ``error`` naming ``what``."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, AspcError):
        return cause
    return error(f"{what}: {type(cause or exc).__name__}: {' '.join(str(cause or exc).split())[:200]}")


def _cause_line(exc: BaseException) -> str:
    """The most telling line of a Ray error: the original exception's message when Ray carries one."""
    text = str(exc)
    for line in reversed(text.splitlines()):
        line = line.strip()
        if "Error:" in line and not line.startswith(("ray.", "File ")):
            return line[:240]
    return " ".join(text.split())[:240]
