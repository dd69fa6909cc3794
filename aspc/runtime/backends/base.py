"""What the real backends share: per-minibatch requests, per-worker engines, replay lengths.

A real backend splits :meth:`~aspc.runtime.contracts.GenerationBackend.generate`
in two, so the same backend runs in threads (local engine) and in Ray actors:

- :meth:`ModelBackend.request` runs where the plan is (the driver): it cuts
  the minibatch's rows out of the plan and attaches the replay lengths. The
  result is small and picklable.
- :meth:`ModelBackend.execute` runs where the worker's model is: it turns a
  request into tokens.

Each worker holds its own model (its own weights version), created by
:meth:`ModelBackend.start_worker` in the process that serves it.
"""

from __future__ import annotations

import threading
from abc import abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from aspc.emit import schema as S
from aspc.errors import ConfigError, InputError, RunError
from aspc.runtime.backends.options import DEFAULT_MAX_NEW_TOKENS, GenerationOptions
from aspc.runtime.contracts import Clock, GenerationBackend, GenerationResult
from aspc.runtime.lengths import join_actual_lengths
from aspc.runtime.work import MinibatchWork, WorkPlan


@dataclass(frozen=True)
class GenerationRequest:
    """One minibatch as a worker needs it: prompts, samples per prompt, and how long each may run."""

    minibatch: int  # plan minibatch id
    sample_start: int  # global id of its first sample; samples are numbered row by row, then sample index
    prompt_ids: list[str]  # plan prompt id per row (a rolling scout row's: its prompt's, emit.schema.prompt_of)
    prompts: list[str]  # plan prompt per row: text, or chat messages as compact JSON
    n_samples: np.ndarray  # int64 per row, >= 1; sum == number of samples
    replay_len: np.ndarray | None  # int64 per sample, tokens each must generate; None = end at EOS
    max_new_tokens: int  # cap on generated tokens per sequence
    run_seed: int = 0  # RunConfig.seed (one more each epoch): with --seed, what hf seeds a minibatch's sampling from

    @property
    def n_total(self) -> int:
        return int(self.n_samples.sum())


class ModelBackend(GenerationBackend):
    """Base of backends that hold one model per worker (``hf``, ``vllm``).

    Parameters
    ----------
    options
        Parsed generation options; ``options.model`` is a resolved local
        directory.
    """

    clock = Clock.WALL
    name: ClassVar[str] = "model"

    def __init__(self, options: GenerationOptions):
        self.options = options
        # Workers whose models this process holds: None = all (local engine);
        # () on the driver's copy under the Ray engine (serve_remotely), (w,) in
        # actor w (worker_copy).
        self.serve_workers: tuple[int, ...] | None = None
        self.n_workers = 0  # W, known after setup
        # Share of one device a worker may fill; None = the backend decides
        # (worker_copy sets it when several Ray actors share a GPU).
        self.device_share: float | None = None
        self._work: WorkPlan | None = None
        self._replay: np.ndarray | None = None  # int64 per global sample id (replay mode)
        self.setup_notes: list[str] = []  # diagnostics of setup() the run reports (cyclic replay lengths)
        self._version: dict[int, int] = {}  # worker -> weights version its model holds
        self._busy: dict[int, bool] = {}  # worker -> generating now (reloads must not happen then)
        self._lock = threading.Lock()
        self._closing = threading.Event()  # set by close(): in-flight generations stop at their next step
        # The run's seed (the engine sets RunConfig.seed before setup: it moves by one per epoch, so an
        # epoch's minibatch k draws other tokens than the last epoch's, and a resumed epoch the same ones).
        self.run_seed = 0
        # Called with W at the end of setup() (see serve_remotely).
        self.on_setup: Callable[[int], None] | None = None
        # Under Ray, runs check_prompts(worker 0, work, cap) in an actor, after on_setup (see serve_remotely).
        self.check_remotely: Callable[[WorkPlan, int], dict[str, int] | None] | None = None
        # Tokens of each plan prompt (by prompt id) as the model's tokenizer renders it, once setup has checked them.
        self.prompt_token_counts: dict[str, int] | None = None
        # A Ray engine's actors left running for the next run on this backend, and how to stop them.
        self._remote: tuple[Any, Callable[[], None]] | None = None
        # The cap a later run on the same prompts will use, checked now too: a scout's own is its cut,
        # and a plan too long for the epochs' --max-new-tokens was refused only after the whole scout.
        self.later_cap: int | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Shipped to Ray actors as a fresh worker_copy: locks do not pickle.
        state = dict(self.__dict__)
        del state["_lock"], state["_closing"]
        state["on_setup"] = state["check_remotely"] = None  # an engine's hooks stay with the engine
        state["_remote"] = None  # and its actors with the driver
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._closing = threading.Event()

    # ---- driver side -----------------------------------------------------------

    def setup(self, work: WorkPlan, n_workers: int) -> None:
        self._work = work
        self.n_workers = n_workers
        if self.options.replay:
            assert self.options.replay_lengths is not None  # GenerationOptions.validate checked it
            joined = join_actual_lengths(
                work,
                self.options.replay_lengths,
                max_new_tokens=self.options.max_new_tokens,
                source_name=self.options.replay_source,
            )
            self._replay, self.setup_notes = joined.response_len, list(joined.notes)
        served = range(n_workers) if self.serve_workers is None else self.serve_workers
        for w in served:
            self.start_worker(w)
        cap = self.options.max_new_tokens
        if cap is None:  # as request() caps: the longest replayed length and its EOS, else the default
            cap = DEFAULT_MAX_NEW_TOKENS if self._replay is None else int(self._replay.max(initial=0)) + 1
        cap = max(int(cap), self.later_cap or 0)
        if self.serve_workers is None and n_workers:
            self.prompt_token_counts = self.check_prompts(0, work, int(cap))
        if self.on_setup is not None:
            self.on_setup(n_workers)
        if self.check_remotely is not None and n_workers:  # under Ray the driver holds no model: an actor checks
            self.prompt_token_counts = self.check_remotely(work, int(cap))

    def check_prompts(self, worker: int, work: WorkPlan, max_new_tokens: int) -> dict[str, int] | None:
        """Refuse, before the run log starts, prompts ``worker``'s model cannot take; return each prompt's tokens.

        The counts (by prompt id, as the model's tokenizer renders the prompt) replace the plan's
        compile-time estimate in the run; None (here: no model) keeps the plan's.
        """
        return None

    def on_revision(self, work: WorkPlan, first: int, new_to_old: np.ndarray) -> None:
        """The undispatched remainder was revised (``aspc run --replan``): replayed lengths follow their samples.

        Runs on the driver. Minibatches already handed out keep their rows and
        sample ids (``new_to_old`` is the identity on them), so a request that
        a worker thread builds meanwhile reads the same rows either way.
        """
        self._work = work
        if self._replay is not None:
            self._replay = self._replay[new_to_old]

    def request(self, work: MinibatchWork) -> GenerationRequest:
        """The request for minibatch ``work`` (cheap; runs on the driver)."""
        plan = self._work
        if plan is None:
            raise RunError("backend used before setup(); this is a bug in the engine")
        r0, r1 = work.row_start, work.row_end
        replay = None if self._replay is None else self._replay[work.sample_start : work.sample_end].copy()
        if self.options.max_new_tokens is not None:
            cap = int(self.options.max_new_tokens)
        elif replay is not None:
            cap = int(replay.max(initial=0)) + 1  # one more step for the forced EOS
        else:
            cap = DEFAULT_MAX_NEW_TOKENS
        holds = plan.holds
        if holds is not None and holds.scout_tokens is not None and holds.held[work.sample_start]:
            cap = min(cap, int(holds.scout_tokens))  # a rolling scout's minibatch: its responses are cut at T
        return GenerationRequest(
            minibatch=work.index,
            sample_start=work.sample_start,
            # A scout row's response is one of its prompt's group: the payload names that prompt.
            prompt_ids=[S.prompt_of(str(p)) for p in plan.prompt_ids[r0:r1]],
            prompts=plan.table.column(S.PROMPT).slice(r0, r1 - r0).to_pylist(),
            n_samples=plan.n_samples[r0:r1].astype(np.int64).copy(),
            replay_len=replay,
            max_new_tokens=max(1, cap),
            run_seed=self.run_seed,
        )

    def generate(self, worker: int, work: MinibatchWork) -> GenerationResult:
        return self.execute(worker, self.request(work))

    def serve_remotely(
        self,
        start_workers: Callable[[int], None],
        check_prompts: Callable[[WorkPlan, int], dict[str, int] | None] | None = None,
    ) -> None:
        """Hold no model in this process; call ``start_workers(W)`` at the end of :meth:`setup` instead.

        The Ray engine's driver copy: its actors hold the models
        (:meth:`worker_copy`), started during setup so that model loading
        happens before the run's clock matters. ``check_prompts(work, cap)``
        then runs :meth:`check_prompts` in an actor, so that prompts the model
        cannot take are refused before the run log starts, as on one machine.
        """
        self.serve_workers = ()
        self.on_setup = start_workers
        self.check_remotely = check_prompts

    def keep_remote(self, handle: Any, release: Callable[[], None]) -> None:
        """Hold ``handle`` (a Ray engine's running actors) for the next run's engine on this backend.

        A backend kept open across runs (``aspc run --epochs``) keeps its models
        loaded; under the Ray engine they live in actors, which the next run's
        engine takes over (:meth:`take_remote`). ``release`` stops them, at
        :meth:`close` at the latest.
        """
        self.release_remote()
        self._remote = (handle, release)

    def take_remote(self) -> Any:
        """What :meth:`keep_remote` holds (``None``: nothing), handed over once."""
        kept, self._remote = self._remote, None
        return None if kept is None else kept[0]

    def release_remote(self) -> None:
        """Stop the actors :meth:`keep_remote` holds, if any (backends call it in :meth:`close`)."""
        kept, self._remote = self._remote, None
        if kept is not None:
            kept[1]()

    def worker_copy(self, worker: int, *, device_share: float | None = None) -> ModelBackend:
        """A fresh, picklable copy that will serve only ``worker`` (for a Ray actor).

        ``device_share``: the fraction of one device the worker may fill, when
        several actors share it.
        """
        copy = type(self)(self.options.for_worker_process())
        copy.serve_workers = (worker,)
        copy.n_workers = self.n_workers
        copy.device_share = device_share
        return copy

    # ---- worker side -------------------------------------------------------------

    @abstractmethod
    def start_worker(self, worker: int) -> None:
        """Load ``worker``'s model (weights version 0) in this process."""

    @abstractmethod
    def _execute(self, worker: int, request: GenerationRequest) -> GenerationResult:
        """Generate ``request`` on ``worker``'s model."""

    @abstractmethod
    def _load(self, worker: int, weights: Any) -> None:
        """Copy ``weights`` (a state dict or a directory of .safetensors) into ``worker``'s model."""

    def execute(self, worker: int, request: GenerationRequest) -> GenerationResult:
        """Generate every sample of ``request`` on ``worker`` and time it."""
        with self._lock:
            self._busy[worker] = True
        try:
            return self._execute(worker, request)
        finally:
            with self._lock:
                self._busy[worker] = False

    def load_weights(self, worker: int, version: int, weights: Any) -> float:
        """Load weights ``version`` into ``worker``'s model; a ``None`` handle only records the version.

        The trainer publishes weights as a state dict (``{name: tensor}``) or
        a directory of ``.safetensors`` files; ``None`` (a simulated trainer)
        changes no parameter.
        """
        import time

        with self._lock:
            if self._busy.get(worker):
                raise RunError(f"worker {worker} was asked to reload weights mid-minibatch; this is a bug in aspc")
        t0 = time.perf_counter()
        if weights is not None:
            self._load(worker, weights)
        self._version[worker] = int(version)
        return time.perf_counter() - t0

    def wait_idle(self, timeout: float = 60.0) -> bool:
        """Ask in-flight generations to stop and wait until none runs; False if some still does.

        After a failure elsewhere in the run, other workers may still be
        generating; their results are no longer wanted, and a model torn down
        under a running thread (or an interpreter exiting around one) crashes
        the process instead of letting it report the failure.
        """
        import time

        self._closing.set()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if not any(self._busy.values()):
                    return True
            time.sleep(0.01)
        return False

    def speed_probe(self, worker: int) -> float:
        """Seconds ``worker`` takes to generate the fixed reference minibatch (:func:`probe_request`).

        Runs through :meth:`execute`, the path every minibatch takes, with
        replayed lengths: the same work on every machine, model and plan.
        """
        try:
            return float(self.execute(worker, probe_request()).elapsed)
        except InputError as exc:
            if not hasattr(exc, "context"):
                raise
            # The prompt is aspc's own: "lower --max-new-tokens or shorten the prompt" was advice no one could take.
            needed, limit = exc.context
            raise ConfigError(f"--speed-probe: its reference minibatch needs {needed} positions per sequence, more "
                              f"than {limit}; drop --speed-probe for this model") from None  # fmt: skip

    def weights_version(self, worker: int) -> int:
        """The weights version ``worker``'s model holds (0 until its first reload)."""
        return self._version.get(worker, 0)


# The reference minibatch of speed_probe: sequences x tokens each (replayed
# exactly), about one small minibatch of decode steps on a CPU.
PROBE_SEQUENCES = 8
PROBE_TOKENS = 32


def probe_request() -> GenerationRequest:
    """The fixed minibatch a speed probe generates: distinct short prompts, exact lengths."""
    return GenerationRequest(
        minibatch=-1,
        sample_start=0,
        prompt_ids=[f"speed-probe-{i}" for i in range(PROBE_SEQUENCES)],
        prompts=[f"Reference prompt {i}: list the numbers from one to one hundred." for i in range(PROBE_SEQUENCES)],
        n_samples=np.ones(PROBE_SEQUENCES, dtype=np.int64),
        replay_len=np.full(PROBE_SEQUENCES, PROBE_TOKENS, dtype=np.int64),
        max_new_tokens=PROBE_TOKENS + 1,
    )


def replay_total(request: GenerationRequest) -> np.ndarray | None:
    """Replay lengths of a request (or ``None``), checked against its sample count."""
    if request.replay_len is None:
        return None
    if request.replay_len.size != request.n_total:
        raise RunError(f"minibatch {request.minibatch}: {request.replay_len.size} replay lengths for "
                       f"{request.n_total} samples; this is a bug in aspc")
    return request.replay_len
