"""The execute half's contracts: generation backends, trainers, and what they exchange.

A backend knows how to generate one minibatch on one worker and how to load
new weights; a trainer knows how to run one step. Neither decides anything:
the :class:`~aspc.runtime.core.scheduler.Scheduler` decides, an
:class:`~aspc.runtime.core.events.Engine` calls these methods (on a virtual
clock for ``sim``, from threads or Ray actors for real backends). This is the
bottom layer of the runtime: it imports no other runtime module at run time,
and :mod:`aspc.runtime.registry` is the only module that knows the concrete
classes.
"""

from __future__ import annotations

import contextlib
import math
import numbers
import signal
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, ClassVar

from aspc import interrupt
from aspc.errors import AspcError, Interrupted, RunError

if TYPE_CHECKING:  # annotations only: the contracts load neither numpy nor pyarrow (fast --help)
    import numpy as np

    from aspc.runtime.work import MinibatchWork, WorkPlan


# Seconds a trainer step may report: the cost model's bound on every coefficient
# (aspc.runtime.backends.sim_cost.COEFFICIENT_MAX, which this bottom layer cannot import).
# 11.6 days is far past any real step; 1e308 pushed the simulated clock to inf.
STEP_ELAPSED_MAX = 1e6


class Clock(str, Enum):
    """Whose seconds a backend's timings are."""

    VIRTUAL = "virtual"  # computed from a cost model; the engine advances a simulated clock
    WALL = "wall"  # measured; the engine runs calls concurrently and reads a real clock


@dataclass
class GenerationResult:
    """What a worker hands back for one minibatch."""

    response_len: np.ndarray  # int64 per sample of the minibatch, in sample-id order, tokens
    finish_offset: np.ndarray  # float64 per sample: seconds from generation start to its end, <= elapsed
    elapsed: float  # seconds the minibatch occupied the worker, reload excluded
    payload: list[Any] | None = None  # per-sample outputs a real trainer needs (tokens, text); None in sim


@dataclass(frozen=True)
class TrainBatch:
    """One global batch handed to the trainer."""

    step: int  # trainer step index; the trainer holds weights version ``step`` while it runs
    samples: np.ndarray  # int64 global sample ids, oldest first, exactly global_batch of them
    response_len: np.ndarray  # int64 per sample, tokens generated
    prompt_tokens: np.ndarray  # int64 per sample, tokens of its prompt
    weights_version: np.ndarray  # int64 per sample, version that generated it (<= step)
    payload: list[Any] | None = None  # per-sample backend outputs, when the backend returns any


@dataclass
class TrainResult:
    """What the trainer hands back after one step."""

    version: int  # the weights version it published: step + 1
    elapsed: float  # seconds the step took
    weights: Any = None  # where workers load that version from (path, handle); None in sim


class GenerationBackend(ABC):
    """Generates minibatches for the workers of one run."""

    clock: ClassVar[Clock] = Clock.WALL  # VIRTUAL backends run only under the simulated clock

    def setup(self, work: WorkPlan, n_workers: int) -> None:  # noqa: B027 - optional hook
        """Called once before the first dispatch, with the whole plan."""

    @abstractmethod
    def load_weights(self, worker: int, version: int, weights: Any) -> float:
        """Load weights ``version`` (published by the trainer as ``weights``) into ``worker``.

        Called only between two minibatches of that worker, when a newer
        version than its own exists. Returns the seconds it took.
        """

    @abstractmethod
    def generate(self, worker: int, work: MinibatchWork) -> GenerationResult:
        """Generate every sample of ``work`` on ``worker`` and return them.

        Called when the dispatcher hands ``work`` to ``worker``; never called
        twice at once for the same worker. Samples are numbered
        ``work.sample_start .. work.sample_end - 1``.
        """

    def speed_probe(self, worker: int) -> float | None:
        """Seconds ``worker`` takes for a fixed reference generation; ``None``: no such thing.

        ``aspc run --speed-probe`` calls it before the first dispatch and after
        the last, so a run log records how fast the machine was during the run
        and runs of different plans can be compared at equal machine speed.
        """
        return None

    def close(self) -> None:  # noqa: B027 - optional hook
        """Called once when the run ends, also after a failure."""


class Trainer(ABC):
    """Consumes global batches and publishes weights versions."""

    clock: ClassVar[Clock] = Clock.WALL

    def setup(self, work: WorkPlan) -> None:  # noqa: B027 - optional hook
        """Called once before the first step."""

    @abstractmethod
    def step(self, batch: TrainBatch) -> TrainResult:
        """Run one optimisation step on ``batch``; return the new version (``batch.step + 1``).

        Called when a global batch is queued and the previous step finished.
        """

    def durable(self, version: int) -> int:
        """The run log now holds ``version`` steps; return the newest version ``<= version`` :meth:`restore` can load.

        Called after each commit of the run log, and on ``--resume`` before
        :meth:`restore`. A trainer that checkpoints every N steps (verl's
        ``save_freq``) returns its newest checkpoint's version: the runtime
        then keeps the logged samples (and payloads) of the steps after it,
        and a resume restores that checkpoint and replays those steps on the
        same batches before generation goes on, so the policy is the one
        the log's samples came from. A checkpoint the answer names must stay
        restorable until a later call names a newer one. The default:
        ``version`` (every step restorable, or no state worth restoring).
        """
        return version

    def resume_refusal(self) -> str | None:
        """Why :meth:`restore` cannot load any version after 0, with the fix; ``None`` (the default) if it can.

        Read when a signal stops a run with a log: a log that holds trainer
        steps then says to start over rather than offering ``--resume``,
        which :meth:`restore` would refuse.
        """
        return None

    def restore(self, version: int) -> Any:
        """Resume a run from the state after weights version ``version`` (``aspc run --resume``).

        Called once, before the first step, when a run continues from its run
        log, with the version :meth:`durable` named; the runtime then replays
        the logged steps from ``version`` on (if any) through :meth:`step`.
        A trainer that checkpoints loads its checkpoint of ``version`` here
        and returns the weights handle workers reload (as
        :attr:`TrainResult.weights`); the default keeps its current state and
        returns ``None``. Under ``--epochs`` it is also called for each
        completed epoch the resume reads back, with that epoch's step count
        (after :meth:`setup` with its plan), which :meth:`durable` must name:
        the next epoch goes on from the state the last one ended with.
        """
        return None

    def current_weights(self) -> Any:
        """A handle to the weights as trained so far (as :attr:`TrainResult.weights`), or ``None``.

        Read between epochs (``aspc run --epochs`` on a real backend): every
        worker loads it as the next epoch's version 0. ``None`` (the default)
        leaves the workers with the weights they hold.
        """
        return None

    def close(self) -> None:  # noqa: B027 - optional hook
        """Called once when the run ends."""


def take_step(trainer: Trainer, batch: TrainBatch, *, replay: bool = False) -> TrainResult:
    r"""``trainer.step(batch)``, with its failures and malformed results as one-line :class:`RunError`\ s.

    A trainer is often the user's code (``--trainer module:factory``): under
    the simulated clock an exception from it was a traceback, and a result
    with a NaN ``elapsed`` never advanced the clock (the run spun forever).
    """
    where = f"replaying step {batch.step}" if replay else f"at step {batch.step}"
    res = _user_code(trainer.step, batch, failed=f"the trainer failed {where}",
                     fix="fix it and rerun (a run with --log continues with --resume)")  # fmt: skip
    if not isinstance(res, TrainResult):
        raise RunError(f"the trainer {where} returned {type(res).__name__}, not a TrainResult; fix its step()")
    el = res.elapsed
    # An int past a float's range is finite (math.isfinite raised OverflowError on it); the bound refuses it.
    huge = isinstance(el, numbers.Integral) and not isinstance(el, bool) and abs(el) > 1e300
    if isinstance(el, bool) or not isinstance(el, numbers.Real) or not (huge or math.isfinite(el)) or el < 0:
        shown = ("an integer below -1e300" if el < 0 else "an integer over 1e300") if huge else repr(el)
        raise RunError(f"the trainer {where} returned elapsed {shown}; step() must return the seconds the step took "
                       "(finite, >= 0)")  # fmt: skip
    # The sim trainer's steps cost α + β·tokens of a bounded cost model: finite, though they may pass one coefficient.
    if el > STEP_ELAPSED_MAX and getattr(trainer, "known_step_cost", lambda: None)() is None:
        shown = "an integer over 1e300" if huge else format(float(el), ".3g")
        raise RunError(f"the trainer {where} returned elapsed {shown}; step() must return the seconds the step took "
                       f"(at most {STEP_ELAPSED_MAX:g} seconds, 11.6 days)")  # fmt: skip
    if res.version != batch.step + 1:
        raise RunError(f"the trainer {where} published version {res.version!r}, not {batch.step + 1}; step() must "
                       "return version batch.step + 1")  # fmt: skip
    return res


def raised_by_code(exc: BaseException) -> bool:
    """Whether ``exc`` came from the code that raised it, not from a signal (a real Ctrl-C stays an interrupt).

    Under :mod:`aspc.interrupt`'s policy a signal is :class:`~aspc.errors.Interrupted`,
    and signals reach the main thread only; a plain ``KeyboardInterrupt`` in the
    main thread under Python's own SIGINT handler may be a real Ctrl-C.

    Raises
    ------
    Interrupted
        ``exc`` is a plain KeyboardInterrupt while aspc's handler has taken a
        signal: Ray's ``ray.get`` (inside a verl-style step, say) turns the
        Interrupted it raised into a plain one, and the signal must not read
        as the trainer's own failure.
    """
    if not isinstance(exc, KeyboardInterrupt):
        return True
    if isinstance(exc, Interrupted):
        return False
    taken = interrupt.signal_taken()
    if taken is not None:
        raise Interrupted(taken) from None
    main = threading.current_thread() is threading.main_thread()
    if not main:
        return True
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        return False  # may be a real Ctrl-C
    # A host's own handler raises it for a real Ctrl-C: noted by _host_sigint_seen's wrapper, while installed.
    return not (_host_sigint[1] is not None and signal.getsignal(signal.SIGINT) is _host_sigint[1] and _host_sigint[0])


# [a SIGINT reached the host's own handler, the wrapper noting it] during the user code now running.
_host_sigint: list[Any] = [False, None]


@contextlib.contextmanager
def _host_sigint_seen() -> Iterator[None]:
    """Around user code, in the main thread, under a host program's own SIGINT handler: note a real SIGINT.

    A KeyboardInterrupt there was read as the trainer's own (its failure, a log marked failed), though the
    host's handler had raised it for the user's Ctrl-C; the handler is wrapped for the block so that
    :func:`raised_by_code` can tell the two apart. aspc's handler and Python's default need no wrapper.
    """
    host = signal.getsignal(signal.SIGINT)
    if (threading.current_thread() is not threading.main_thread() or not callable(host)
            or host is signal.default_int_handler or interrupt.policy_active()):  # fmt: skip
        yield
        return

    def noted(signum: int, frame: Any) -> Any:
        _host_sigint[0] = True
        return host(signum, frame)

    outer = list(_host_sigint)
    _host_sigint[:] = [False, noted]
    signal.signal(signal.SIGINT, noted)
    try:
        yield
    finally:
        if signal.getsignal(signal.SIGINT) is noted:  # user code that set its own keeps it
            signal.signal(signal.SIGINT, host)
        # A nested block's wrapper calls the outer one, but a SIGINT it saw is the outer block's too.
        _host_sigint[:] = [outer[0] or _host_sigint[0], outer[1]]


class _CodeFailed(RunError):
    """A trainer's own code failed (as opposed to an aspc error it passed on)."""


def _user_code(fn: Callable[..., Any], *args: Any, failed: str, fix: str) -> Any:
    """``fn(*args)``, a trainer's code: signals kept (:func:`signals_kept`); an exception or ``sys.exit`` from it
    is one line, ``"{failed}: {type}: {message}; {fix}"`` (it was a traceback); aspc's own errors pass."""
    with signals_kept():
        try:
            return fn(*args)
        except AspcError:
            raise
        except BaseException as exc:  # user code: one line (its message may span several)
            if not raised_by_code(exc):
                raise
            # A BaseException of the user's own (neither an error, an exit nor Ctrl-C) was a traceback under
            # the CLI; a caller of the Python API gets it back as it is (pytest.skip, a cancellation).
            if not isinstance(exc, (Exception, SystemExit, KeyboardInterrupt)) and not interrupt.policy_active():
                raise
            raise _CodeFailed(f"{failed}: {_said(exc)}; {fix}") from exc


@contextlib.contextmanager
def signals_kept() -> Iterator[None]:
    """Around a trainer's code: aspc's signal handlers put back if it installed its own (torch, Ray, a
    ``signal.signal(SIGINT, default_int_handler)`` in ``setup``), and a Ctrl-C that came out of it as a plain
    KeyboardInterrupt read as the interrupt it is (it was "Aborted!" and a log marked failed)."""
    from aspc import interrupt_libraries

    with interrupt_libraries.kept(), interrupt_libraries.ours_again(), _host_sigint_seen():
        yield


def _said(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - a user's exception whose __str__ fails: its type still says something
        text = ""
    msg = " ".join(text.split())[:300]
    return f"{type(exc).__name__}{': ' + msg if msg else ''}"


def trainer_hook(trainer: Trainer, hook: str, *args: Any, fail: bool = True) -> RunError | None:
    r"""``trainer.setup(work)`` or ``trainer.close()``, a failure as a one-line :class:`RunError`.

    As :func:`take_step` for ``step``: an exception (or ``sys.exit``) from a user's hook was a
    traceback, and from ``close`` it left the run log 'running'. ``fail=False`` returns the
    error instead, for the run to raise once its log is complete.
    """
    done = "the run is complete, but " if hook == "close" else ""  # what was logged stands
    try:
        _user_code(getattr(trainer, hook), *args, failed=f"{done}the trainer's {hook}() failed", fix="fix it and rerun")
    except _CodeFailed as err:
        if fail:
            raise
        return err
    return None


def durable_version(trainer_durable: Callable[[int], Any], version: int) -> int:
    """``trainer.durable(version)``, checked: an int in ``0..version`` (a str was a ValueError traceback)."""
    floor = _user_code(trainer_durable, int(version), failed="the trainer's durable() failed", fix="fix it and rerun")
    if isinstance(floor, bool) or not isinstance(floor, numbers.Integral) or not 0 <= floor <= version:
        raise RunError(f"the trainer's durable({version}) returned {floor!r}; it must be a version from 0 to {version} "
                       "(the newest it can restore)")  # fmt: skip
    return int(floor)


def restore_version(trainer: Trainer, version: int) -> Any:
    """``trainer.restore(version)``, a failure as a one-line :class:`RunError` (it was a traceback on ``--resume``)."""
    return _user_code(trainer.restore, int(version), failed=f"the trainer's restore({version}) failed",
                      fix="fix it and rerun with --resume")  # fmt: skip


@dataclass
class BackendContext:
    """Everything a backend factory may need; backends ignore what they do not use."""

    n_workers: int  # W
    reload_time: float = 0.0  # seconds per weight reload (sim)
    sim_cost_model: Any = None  # aspc.runtime.backends.sim_cost.SimCostModel: step times of the sim
    response_len: np.ndarray | None = None  # int64 per sample: lengths the sim replays
    options: dict[str, Any] = field(default_factory=dict)  # backend-specific (model path, device, ...)


@dataclass(frozen=True)
class ReplanView:
    """What a :class:`Replanner` sees at a window: the work so far and what came back."""

    work: WorkPlan  # the plan as the runtime holds it now (rows in dispatch order)
    first_undispatched: int  # minibatches >= this were never handed out; < this are fixed
    response_len: np.ndarray  # int64 per sample id: tokens generated, -1 where not returned yet
    step: int  # trainer steps finished so far
    revision: int  # revisions applied so far (the next one gets this id + 1)


class Replanner(ABC):
    """Revises the undispatched remainder of a run (``aspc run --replan``).

    The runtime never imports the compiler: whoever starts a run with
    re-planning (``aspc.replan``) passes an implementation in.
    """

    every_steps: int | None = 1  # a window: called after every this many trainer steps (None: never on steps)
    # A rolling scout's replanner: scout rows are held, prompt-planned minibatches pending (aspc.runtime.hold).
    holds_scouts: bool = False

    def wants_revision(self, work: WorkPlan, observed: Callable[[], Any]) -> bool:
        """Whether to revise ``work`` now, between windows.

        Asked after every turn of the run's loop while a remainder exists;
        must be cheap. ``observed()`` gives the tokens per sample id (-1 where
        not returned); it applies the arrivals buffered since the last call,
        so call it only when the answer needs it. The default: only at step
        windows.
        """
        return False

    @abstractmethod
    def revise(self, view: ReplanView) -> Any:
        """Return the revised remainder, or ``None`` to keep it.

        Called between events, after a trainer step completes a window (or
        when :meth:`wants_revision` says so). The
        result is a plan table (PLAN_SCHEMA rows, minibatches numbered from 0
        in dispatch order) holding exactly the prompts of minibatches
        ``>= view.first_undispatched``, each with its ``n_samples``; the
        runtime renumbers its minibatches from ``first_undispatched`` on.
        """

    def largest_minibatch(self, work: WorkPlan) -> int:
        """Samples in the largest minibatch of ``work`` or of any revision this replanner may make of it.

        The ``--max-staleness`` check is sized by it before the run starts:
        a revised minibatch of more than K global batches could never be
        dispatched. The default: ``work``'s own.
        """
        return int(work.minibatch_sizes.max())

    def notes(self) -> list[str]:
        """One-line diagnostics for the end of the run (e.g. why nothing was revised). The default: none."""
        return []

    def stored_revisions(self) -> list[tuple[int, Any]]:
        """The revisions this replanner made in the run being resumed, oldest first.

        Each is ``(first_undispatched, remainder table)`` exactly as
        :meth:`revise` returned it; ``--resume`` applies them to the plan
        before restoring the log, so the log's minibatch numbers mean what
        they meant. The default: none kept.
        """
        return []
