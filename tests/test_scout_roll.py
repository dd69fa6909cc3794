"""The rolling scout: scout samples held inside a run for their groups (aspc.runtime.hold, asp+scout+roll)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aspc.cli import main
from aspc.compiler import CompileConfig, InputOptions
from aspc.emit import schema as S
from aspc.errors import AspcError, ConfigError, PlanError, RunError
from aspc.rolling_scout import RollingScout, scout_windows
from aspc.runtime import RunConfig, run
from aspc.runtime.backends.sim_cost import SimCostModel
from aspc.runtime.contracts import Replanner, Trainer, TrainResult
from aspc.runtime.hold import PENDING_KEY, initial_holds, scout_row_mask
from aspc.runtime.work import work_from_table
from aspc.simulate import comparison_table, simulate_strategies
from tests.conftest import trainer_failing_at


def _plan(rows: list[tuple[str, int, int]]) -> pa.Table:
    """A hand-made plan: (prompt id, n_samples, minibatch) per row, in dispatch order; one group per minibatch."""
    n = len(rows)
    cols = {
        S.PROMPT_ID: pa.array([r[0] for r in rows]),
        S.SOURCE_ROW: pa.array(np.arange(n, dtype=np.int64)),
        S.PROMPT: pa.array([f"prompt {r[0]}" for r in rows]),
        S.PROMPT_TOKENS: pa.array(np.full(n, 8, dtype=np.int64)),
        S.N_SAMPLES: pa.array([r[1] for r in rows], pa.int32()),
        **{c: pa.array(np.full(n, 100.0)) for c in (S.PREDICTED_LEN, S.PREDICTED_Q10, S.PREDICTED_Q50, S.PREDICTED_Q90)},
        S.MINIBATCH: pa.array([r[2] for r in rows], pa.int32()),
        S.GROUP: pa.array([r[2] for r in rows], pa.int32()),
        S.DISPATCH_RANK: pa.array(np.arange(n, dtype=np.int64)),
    }
    return pa.table(cols).cast(S.PLAN_SCHEMA)


class _Fixed(Replanner):
    """A hand-made rolling replanner: once ``scouts`` (sample ids) returned, the remainder as it is with ``counts``."""

    every_steps = None
    holds_scouts = True

    def __init__(self, scouts: list[int], counts: dict[str, int]):
        self.scouts, self.counts, self.done = np.asarray(scouts), counts, False

    def wants_revision(self, work, observed) -> bool:
        return not self.done and bool(np.all(observed()[self.scouts] >= 0))

    def revise(self, view):
        self.done = True
        w = view.work
        t = w.table.slice(int(w.row_offsets[view.first_undispatched]))
        n = [self.counts.get(p, int(k)) for p, k in zip(t.column(S.PROMPT_ID).to_pylist(),
                                                          t.column(S.N_SAMPLES).to_numpy(), strict=True)]  # fmt: skip
        for name, v in ((S.MINIBATCH, t.column(S.MINIBATCH).to_numpy() - view.first_undispatched),
                        (S.GROUP, t.column(S.GROUP).to_numpy() - int(t.column(S.GROUP).to_numpy().min())),
                        (S.N_SAMPLES, np.asarray(n))):  # fmt: skip
            i = t.schema.get_field_index(name)
            t = t.set_column(i, t.schema.field(i), pa.array(v.astype(np.int32), pa.int32()))
        return t.replace_schema_metadata({PENDING_KEY: b"[]"})


X = S.SCOUT_ID_SUFFIX
# Scout minibatch 0 (prompts a, b; b's response is cut), then, pending until the revision the scout's
# return triggers, an unrelated long minibatch 1 and the groups of a and b in minibatch 2. The revision
# plans a with one sample fewer: its scout's response is the group's third.
_ROWS = [("a" + X, 1, 0), ("b" + X, 1, 0), ("c", 3, 1), ("a", 3, 2), ("b", 3, 2)]
_LENGTHS = {"a" + X: [50.0], "b" + X: [60.0], "c": [900.0, 800.0, 700.0], "a": [40.0, 45.0, 47.0],
            "b": [30.0, 35.0, 33.0]}  # fmt: skip


def _columns(res):
    mbs = res.columns["minibatches"]
    by_mb = {int(m): (float(s), float(e), int(v)) for m, s, e, v in
             zip(mbs["minibatch"], mbs["start"], mbs["end"], mbs["weights_version"], strict=True)}  # fmt: skip
    return res.columns["samples"], by_mb


@pytest.mark.parametrize("mode", ["static", "continuous"])
def test_a_held_sample_is_consumed_with_its_group_and_a_cut_one_never(mode):
    rc = RunConfig(workers=2, global_batch=3, seed=0, return_mode=mode)
    res = run(_plan(_ROWS), config=rc, actual_lengths=_LENGTHS, replanner=_Fixed([0, 1], {"a": 2}))
    smp, by_mb = _columns(res)
    step = np.asarray(smp["consumed_step"])
    version = np.asarray(smp["weights_version"])
    # Sample ids after the revision: a's scout 0, b's 1, c 2-4, a 5-6, b 7-9.
    assert step.size == 10 and step[1] == -1  # the cut scout response is never a training sample
    assert step[0] >= 0 and step[5] - 1 <= step[0] <= step[5]  # queued right before its group's first sample
    assert version[0] == by_mb[0][2] and np.asarray(smp["policy_lag"])[0] == step[0] - version[0]
    assert min(by_mb[1][0], by_mb[2][0]) >= by_mb[0][1]  # pending minibatches start after the revision
    assert res.summary.n_trainer_steps == 3  # 9 samples queued (8 generated for groups + the kept one)
    assert res.summary.extra["samples_held"] == {"kept": 1, "cut": 1}


def test_a_pending_minibatch_waits_for_its_revision_even_with_a_worker_idle():
    plan = _plan([("s" + X, 1, 0), ("s", 2, 1), ("y", 1, 2)])
    lens = {"s" + X: [2000.0], "s": [10.0, 12.0], "y": [10.0]}
    res = run(plan, config=RunConfig(workers=2, global_batch=1, seed=0), actual_lengths=lens,
              replanner=_Fixed([0], {"s": 1}))  # fmt: skip
    _, by_mb = _columns(res)
    assert by_mb[1][0] >= by_mb[0][1] and by_mb[2][0] >= by_mb[1][0]  # plan order is kept behind the gate
    assert res.summary.n_trainer_steps == 3


def test_bad_marks_and_revisions_are_errors():
    with pytest.raises(PlanError, match="exactly one sample"):
        initial_holds(work_from_table(_plan([("a" + X, 2, 0), ("a", 1, 1)])))
    with pytest.raises(PlanError, match="mixes scout rows with others"):
        initial_holds(work_from_table(_plan([("a" + X, 1, 0), ("b", 1, 0), ("a", 1, 1)])))
    with pytest.raises(PlanError, match="no scout row"):
        initial_holds(work_from_table(_plan([("a", 1, 0)])))
    rc = RunConfig(workers=1, global_batch=1, seed=0)
    with pytest.raises(RunError, match="more than its scout response"):
        run(_plan(_ROWS), config=rc, actual_lengths=_LENGTHS, replanner=_Fixed([0, 1], {"a": 1}))
    rows = [("a" + X, 1, 0), ("b" + X, 1, 1), ("a", 3, 2), ("b", 3, 2)]
    lens = {"a" + X: [50.0], "b" + X: [2000.0], "a": [40.0] * 3, "b": [30.0] * 3}
    with pytest.raises(RunError, match="has not returned"):  # keeps b's scout once a's came back, before b's
        run(_plan(rows), config=RunConfig(workers=2, global_batch=1), actual_lengths=lens,
            replanner=_Fixed([0], {"b": 2}))  # fmt: skip
    with pytest.raises(RunError, match="stalled|nothing"):  # never revised: the run stops, it does not hang
        run(_plan(_ROWS), config=rc, actual_lengths=_LENGTHS, replanner=_Fixed([5], {}))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"config": RunConfig(workers=2, global_batch=3, max_staleness=2)}, "--max-staleness"),
        ({"carried": np.array([-1, -1, -1, 5, -1])}, "does not combine with re-planning"),
    ],
)
def test_the_runtime_refuses_what_it_cannot_hold(tmp_path, changes, message):
    kwargs = {"config": RunConfig(workers=2, global_batch=3), "actual_lengths": _LENGTHS,
              "replanner": _Fixed([0, 1], {"a": 2}), **changes}  # fmt: skip
    with pytest.raises(ConfigError, match=message):
        run(_plan(_ROWS), **kwargs, log_dir=tmp_path / "log")
    assert not (tmp_path / "log").exists()


def _dataset(tmp_path: Path, n: int, seed: int, k: int = 6) -> Path:
    """Prompts whose levels differ widely (so a scout is worth its cost), k recorded lengths each."""
    rng = np.random.default_rng(seed)
    level = rng.normal(5.3, 1.0, size=n)
    path = tmp_path / f"in-{n}-{seed}.jsonl"
    with open(path, "w") as f:
        for i in range(n):
            lens = np.clip(np.round(np.exp(level[i] + 0.3 * rng.normal(size=k))), 1, 4096).astype(int)
            f.write(json.dumps({"id": f"p{i}", "prompt": f"question number {i}", "lengths": lens.tolist()}) + "\n")
    return path


def _roll(path: Path, n: int, workers: int, gb: int, windows: int, seed: int, mode: str = "static", repeats: int = 1,
          strategies=("asp+scout+roll",)):  # fmt: skip
    cfg = CompileConfig(samples_per_prompt=n, seed=seed, workers=workers, max_response_length=1024)
    rc = RunConfig(workers=workers, global_batch=gb, seed=seed, max_new_tokens=1024, return_mode=mode)
    return simulate_strategies(path, InputOptions(length_field="lengths"), cfg, rc, strategies=list(strategies),
                               scout_windows=windows, scout_tokens=256, repeats=repeats)  # fmt: skip


def _roller(tmp_path: Path, n_prompts: int, n: int, workers: int, windows: int, seed: int, keep: bool = True):
    """A rolling scout over a generated dataset (a maker, one per run), the lengths its rows replay, the kept scouts."""
    from aspc.compiler import prepare

    path = _dataset(tmp_path, n_prompts, seed, k=n + 1)
    recs = [json.loads(line) for line in open(path)]
    cfg = CompileConfig(samples_per_prompt=n, seed=seed, workers=workers, max_response_length=1024)
    table, prior, _ = prepare(path, InputOptions(), cfg)
    spare = {r["id"]: float(r["lengths"][n]) for r in recs}
    lens = {r["id"]: r["lengths"][:n] for r in recs} | {p + X: [min(v, 256.0)] for p, v in spare.items()}
    kept = {p: keep and v < 256 for p, v in spare.items()}
    return (lambda log=None: RollingScout(table, prior, cfg, workers, 256, windows, {}, log_dir=log, keep=keep)), lens, kept


def _scouted(roll) -> set[str]:
    """The prompts of the scouted windows: all of them with one window, else all but the first window's."""
    return {str(p) for sub in roll.subs[roll.start :] for p in sub.ids}


def _check_holds(roll, kept, n, smp, by_mb) -> None:
    """Every hold and gate of a finished rolling run against its sample columns (final ids) and minibatch rows."""
    scouted = _scouted(roll)
    assert roll.start == (1 if roll.windows > 1 else 0)
    kept = {p: v and p in scouted for p, v in kept.items()}  # the first window's prompts have no scout
    w = roll.work
    ids = w.prompt_ids.tolist()
    scout = scout_row_mask(w)
    row_of = {p: r for r, p in enumerate(ids)}
    first = np.r_[0, np.cumsum(w.n_samples)[:-1]]
    row_mb = np.repeat(np.arange(w.n_minibatches), np.diff(w.row_offsets))
    step, version = np.asarray(smp["consumed_step"]), np.asarray(smp["weights_version"])
    lag = np.asarray(smp["policy_lag"])
    assert roll.done == roll.windows and sorted(ids) == sorted([*kept, *(p + X for p in scouted)])
    assert np.all(lag[step >= 0] == (step - version)[step >= 0])
    assert np.array_equal(w.n_samples[~scout], [n - int(kept[p]) for p, s in zip(ids, scout, strict=True) if not s])
    scout_end = min(by_mb[int(m)][1] for m in row_mb[scout])
    for sub in roll.subs[: roll.start]:  # planned from the prior, never pending: dispatched before any scout returns
        assert min(by_mb[int(row_mb[row_of[str(p)]])][0] for p in sub.ids) <= scout_end
    for sub in roll.subs[roll.start :]:
        window = [str(p) for p in sub.ids]
        scouted = max(by_mb[int(row_mb[row_of[p + X]])][1] for p in window)
        for p in window:
            r, s = row_of[p], row_of[p + X]
            assert by_mb[int(row_mb[r])][0] >= scouted  # planned from its window's whole scout: starts after it
            assert version[first[s]] == by_mb[int(row_mb[s])][2]  # generated by the scout minibatch's weights
            if not kept[p]:
                assert step[first[s]] == -1  # a cut scout is never a sample
            elif step[first[r]] >= 0:  # consumed with its group: in its first sample's step or the one before
                assert step[first[r]] - 1 <= step[first[s]] <= step[first[r]]


def _checked_roll(tmp_path: Path, n_prompts: int, n: int, workers: int, gb: int, windows: int, mode: str, seed: int):
    """A rolling scout run on its own, every gate and hold checked against the run's columns."""
    make, lens, kept = _roller(tmp_path, n_prompts, n, workers, windows, seed)
    roll = make()
    rc = RunConfig(workers=workers, global_batch=gb, seed=seed, max_new_tokens=1024, return_mode=mode)
    res = run(roll.initial, config=rc, actual_lengths=lens, replanner=roll)
    smp, by_mb = _columns(res)
    _check_holds(roll, kept, n, smp, by_mb)
    # n samples of every prompt reach the queue (cut scouts never): the trainer steps of a plain run.
    assert res.summary.n_trainer_steps == n * n_prompts // gb
    scouted = _scouted(roll)
    n_kept = sum(v for p, v in kept.items() if p in scouted)
    assert res.summary.extra["samples_held"] == {"kept": n_kept, "cut": len(scouted) - n_kept}
    return roll, res


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    n_prompts=st.integers(10, 90),
    n=st.integers(2, 5),
    workers=st.integers(1, 5),
    gb=st.sampled_from([3, 12, 30]),
    windows=st.integers(1, 6),
    mode=st.sampled_from(["static", "continuous"]),
    seed=st.integers(0, 3),
)
def test_rolling_scout_invariants(tmp_path, n_prompts, n, workers, gb, windows, mode, seed):
    _checked_roll(tmp_path, n_prompts, n, workers, gb, windows, mode, seed)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    n_prompts=st.integers(10, 90),
    n=st.integers(1, 5),
    workers=st.integers(1, 5),
    mult=st.integers(1, 3),
    k=st.integers(1, 4),
    windows=st.integers(1, 6),
    mode=st.sampled_from(["static", "continuous"]),
    seed=st.integers(0, 3),
)
def test_rolling_scout_under_a_staleness_bound(tmp_path, n_prompts, n, workers, mult, k, windows, mode, seed):
    # Under --max-staleness K the scouts only inform the plan: every group is generated whole, no scout
    # response is consumed, and every consumed sample's lag is <= K. Every revised minibatch fits the
    # bound its replanner declared before the run (the staleness check is sized by it).
    make, lens, kept = _roller(tmp_path, n_prompts, n, workers, windows, seed, keep=False)
    roll = make()
    bound = roll.largest_minibatch(work_from_table(roll.initial))
    gb = -(-bound // k) * mult
    rc = RunConfig(workers=workers, global_batch=gb, seed=seed, max_new_tokens=1024, return_mode=mode, max_staleness=k)
    res = run(roll.initial, config=rc, actual_lengths=lens, replanner=roll)
    smp, by_mb = _columns(res)
    _check_holds(roll, kept, n, smp, by_mb)
    w = roll.work
    scouts = scout_row_mask(w)[w.row_offsets[:-1]]  # a minibatch holds scout rows only, or none
    assert int(w.minibatch_sizes[~scouts].max()) <= bound  # a scout minibatch is never consumed: any size starts
    s = res.summary
    assert s.policy_lag_max is None or s.policy_lag_max <= k
    scouted = len(_scouted(roll))
    assert s.extra["samples_held"] == {"kept": 0, "not_kept": scouted}
    assert s.n_trainer_steps == n * n_prompts // gb
    assert s.samples_generated == s.samples_planned == n_prompts * n + scouted


def test_a_keeping_rolling_scout_is_refused_under_a_staleness_bound(tmp_path):
    make, lens, _ = _roller(tmp_path, 30, 3, 2, 2, 0)
    roll = make()
    with pytest.raises(ConfigError, match="does not combine with --max-staleness"):
        run(roll.initial, config=RunConfig(workers=2, global_batch=400, max_staleness=2), actual_lengths=lens,
            replanner=roll)  # fmt: skip


@pytest.mark.parametrize(("mode", "at"), [("static", 3), ("static", 11), ("continuous", 7)])
def test_a_failed_rolling_run_resumes_with_its_holds(tmp_path, mode, at):
    import pyarrow.dataset as ds

    make, lens, kept = _roller(tmp_path, 90, 4, 3, 4, 1)
    rc = RunConfig(workers=3, global_batch=8, seed=1, max_new_tokens=1024, return_mode=mode, log_flush_seconds=0.0)
    log = tmp_path / "RUN"
    first = make(log)
    with pytest.raises(RunError, match="the trainer failed at step .*: RuntimeError: trainer lost"):  # one line
        run(first.initial, config=rc, actual_lengths=lens, replanner=first, log_dir=log, trainer=trainer_failing_at(at))
    assert json.loads((log / "meta.json").read_text())["status"] == "failed"
    revised = range(1, first.done - first.start + 1)  # the first window is planned before the run, not revised
    assert sorted(p.name for p in (log / "plans").glob("*")) == [f"revision-{k}.parquet" for k in revised]
    other, _, _ = _roller(tmp_path, 90, 4, 3, 5, 1)  # another window count: another plan, refused, log kept
    with pytest.raises(AspcError):
        run(other(log).initial, config=rc, actual_lengths=lens, replanner=other(log), log_dir=log, resume=True)
    assert json.loads((log / "meta.json").read_text())["status"] == "failed"
    roll = make(log)
    res = run(roll.initial, config=rc, actual_lengths=lens, replanner=roll, log_dir=log, resume=True)
    assert res.summary.n_trainer_steps == 4 * 90 // 8
    held = json.loads((log / "meta.json").read_text())["summary"]["samples_held"]
    assert held == res.summary.extra["samples_held"] and held["kept"] > 0
    again = make(log)  # the complete log read back says what the run said
    assert run(again.initial, config=rc, actual_lengths=lens, replanner=again, log_dir=log, resume=True).summary.extra[
        "samples_held"
    ] == held
    w = roll.work
    rows = ds.dataset(str(log / "samples")).to_table().to_pydict()
    row_of = {p: r for r, p in enumerate(w.prompt_ids.tolist())}
    start = np.r_[0, np.cumsum(w.n_samples)[:-1]]
    sid = np.array([start[row_of[p]] + i for p, i in zip(rows["prompt_id"], rows["sample_index"], strict=True)])
    assert np.array_equal(np.sort(sid), np.arange(w.n_total_samples))  # every sample once
    smp = {k: np.asarray([-1 if v is None else v for v in rows[k]])[np.argsort(sid)]
           for k in ("consumed_step", "weights_version", "policy_lag")}  # fmt: skip
    mbs = ds.dataset(str(log / "minibatches")).to_table().to_pydict()
    by_mb = {int(m): (float(s), float(e), int(v)) for m, s, e, v in
             zip(mbs["minibatch"], mbs["start"], mbs["end"], mbs["weights_version"], strict=True)}  # fmt: skip
    _check_holds(roll, kept, 4, smp, by_mb)


def test_later_scouts_run_inside_the_epoch(tmp_path):
    roll, _ = _checked_roll(tmp_path, 120, 4, 3, 8, 4, "static", 3)
    scout = scout_row_mask(roll.work)
    row_mb = np.repeat(np.arange(roll.work.n_minibatches), np.diff(roll.work.row_offsets))
    scout_mbs, rest_mbs = sorted(set(row_mb[scout].tolist())), sorted(set(row_mb[~scout].tolist()))
    assert scout_mbs[0] == 0 and scout_mbs[-1] > rest_mbs[0]  # window 1's scout first, the others within
    assert roll.windows == 4


def test_default_windows_hold_about_one_full_scout_each():
    # A window's scout decodes for its cut T however few prompts it holds, so windows of few prompts pay
    # it for little work: 8 windows of 75 (the old default) ran the example at 1.23 x random; one window
    # per 256 prompts gives it 2, measured 0.79-0.83.
    assert [scout_windows(None, n) for n in (1, 100, 383, 384, 600, 2218, 10**6)] == [1, 1, 1, 2, 2, 8, 8]
    assert scout_windows(3, 2) == 2 and scout_windows(12, 10**6) == 12  # an explicit count stands
    with pytest.MonkeyPatch.context() as mp:  # the old default on the same run: worse than random
        mp.setattr("aspc.rolling_scout.WINDOW_PROMPTS", 1)
        old = _example_roll()
    assert old["scout"]["windows"] == 8 and old["mean_iteration_time_vs_random"] > 1.0
    roll = _example_roll()
    assert roll["scout"]["windows"] == 2 and roll["mean_iteration_time_vs_random"] < 0.9


def _example_roll() -> dict:
    from tests.conftest import EXAMPLE

    r = CliRunner().invoke(main, ["simulate", str(EXAMPLE), "--length-field", "lengths", "--samples-per-prompt", "8",
                                  "--workers", "8", "--global-batch", "256", "--max-new-tokens", "4096",
                                  "--strategies", "random,asp+scout+roll", "--repeats", "3", "--json", "--quiet"])  # fmt: skip
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)["strategies"]["asp+scout+roll"]


def test_rolling_scout_keeps_the_gain_with_a_shorter_lag(tmp_path):
    path = _dataset(tmp_path, 400, 11, k=8)
    res = _roll(path, 6, 4, 24, 4, 0, repeats=2, strategies=("random", "asp+scout", "asp+scout+keep", "asp+scout+roll"))
    table = comparison_table(res)
    ratio = {k: table[k]["mean_iteration_time_vs_random"] for k in ("asp+scout", "asp+scout+keep", "asp+scout+roll")}
    lag = {k: table[k]["policy_lag_max"] for k in ("asp+scout", "asp+scout+keep", "asp+scout+roll")}
    # Measured here: roll below asp+scout (its scouts are kept and, but for the first, overlap the epoch),
    # its oldest sample far younger than keep's, whose kept samples are as old as the epoch.
    assert ratio["asp+scout+roll"] < ratio["asp+scout"], json.dumps([ratio, lag])
    assert lag["asp+scout+roll"] < lag["asp+scout+keep"], json.dumps([ratio, lag])


def test_simulate_cli_scout_roll(tmp_path):
    path = _dataset(tmp_path, 120, 5)
    args = ["simulate", str(path), "--length-field", "lengths", "--samples-per-prompt", "4", "--workers", "3",
            "--global-batch", "16", "--max-new-tokens", "1024", "--strategies", "random,asp+scout+roll", "--json"]
    runner = CliRunner()
    r = runner.invoke(main, [*args, "--scout-windows", "3"])
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)["strategies"]["asp+scout+roll"]
    for key in ("mean_iteration_time", "makespan", "lower_bound", "policy_lag_max", "n_trainer_steps"):
        assert key in got
    assert got["scout"]["windows"] == 3 and got["scout"]["tokens"] == 256
    assert runner.invoke(main, [*args, "--scout-windows", "3"]).stdout == r.stdout  # same input and seed
    for extra, message in (
        (["--scout-windows", "0"], "--scout-windows must be an integer >= 1, got 0"),
        (["--samples-per-prompt", "1"], "needs --samples-per-prompt >= 2 (got 1)"),
    ):
        bad = runner.invoke(main, [*args, *extra])
        assert bad.exit_code != 0 and message in bad.output and "Traceback" not in bad.output, bad.output
        assert len(bad.output.strip().splitlines()) == 1
    bounded = runner.invoke(main, [*args, "--scout-windows", "3", "--max-staleness", "4"])
    assert bounded.exit_code == 0, bounded.output
    got = json.loads(bounded.stdout)["strategies"]["asp+scout+roll"]
    assert got["policy_lag_max"] <= 4 and got["scout"]["responses_kept"] == 0  # under a bound it keeps none
    no_roll = [*args[:-2], "random,asp", "--json", "--scout-windows", "3"]
    bad = runner.invoke(main, no_roll)
    assert bad.exit_code != 0 and "--scout-windows applies to the asp+scout+roll strategy" in bad.output


def _run_roll_args(plan: Path, data: Path, log: Path, *extra: str) -> list[str]:
    return ["run", str(plan), "--actual-lengths", str(data), "--length-field", "lengths", "--workers", "3",
            "--samples-per-prompt", "4",
            "--global-batch", "16", "--max-new-tokens", "1024", "--scout", "--scout-roll", "--scout-windows", "3",
            "--log", str(log), "--log-flush-seconds", "0.02", "--quiet", *extra]  # fmt: skip


def test_run_scout_roll_under_a_bound_resumes_after_sigkill(tmp_path):
    # Under --max-staleness the rolling scout keeps nothing: a killed run resumes to the same samples, each
    # group whole, no scout consumed, every lag within the bound.
    import pyarrow.dataset as ds

    from aspc.runtime.engines.virtual import TEST_DELAY_ENV
    from tests.test_runtime_resume import _cli, _kill_mid_run

    data = _dataset(tmp_path, 120, 6)
    plan = tmp_path / "plan.parquet"
    runner = CliRunner()
    assert runner.invoke(main, ["compile", str(data), "--samples-per-prompt", "4", "--workers", "3", "-o", str(plan),
                                "--quiet"]).exit_code == 0  # fmt: skip
    bound = ("--max-staleness", "4")
    ref = tmp_path / "REF"
    first = runner.invoke(main, [*_run_roll_args(plan, data, ref, *bound), "--json"])
    assert first.exit_code == 0, first.output
    # 3 windows of 40 prompts: the first planned from the prior, the other 80 scouted.
    assert json.loads(first.stdout)["epochs"][0]["samples_held"] == {"kept": 0, "not_kept": 80}
    ref_rows = _log_rows(ref)
    assert sum(1 for p, _ in ref_rows if not p.endswith(X)) == 4 * 120
    assert not any(c for (p, _), (_, c) in ref_rows.items() if p.endswith(X))  # no scout consumed
    log = tmp_path / "RUN"
    p = _cli(_run_roll_args(plan, data, log, *bound), env={TEST_DELAY_ENV: "0.02"})
    killed = _kill_mid_run(p, log / "epoch-1", 0.3)
    p = _cli(_run_roll_args(plan, data, log, *bound, "--resume"))
    _, err = p.communicate()
    assert p.returncode == 0, err
    assert killed and _log_rows(log) == ref_rows
    lag = [r["policy_lag"] for r in ds.dataset(str(log / "epoch-1" / "samples")).to_table().to_pylist()
           if r["policy_lag"] is not None]  # fmt: skip
    assert lag and max(lag) <= 4


def _kept_of(log: Path) -> list[bool]:
    """Per prompt of a rolling run's epoch 1, whether its scout response joined its group (so it has n - 1 rows)."""
    return [bool(c) for (p, _), (_, c) in _log_rows(log).items() if p.endswith(X)]


def _log_rows(log: Path) -> dict:
    import pyarrow.dataset as ds

    rows = ds.dataset(str(log / "epoch-1" / "samples")).to_table().to_pylist()
    # A resumed run's workers reload and take their minibatches at other times (versions and steps move);
    # what it generated, and which held responses joined a group, may not.
    return {(r["prompt_id"], r["sample_index"]): (r["response_len"], r["consumed_step"] is not None) for r in rows}


def test_run_scout_roll_is_simulate_and_resumes_after_sigkill(tmp_path):
    # `aspc run --scout --scout-roll` is `simulate --strategies asp+scout+roll` (one machinery: the plan
    # revised when each window's scout returns), writes each revision as a checked plan, and after a SIGKILL
    # mid-epoch resumes to the same samples, held ones included.
    from aspc.runtime.engines.virtual import TEST_DELAY_ENV
    from tests.test_runtime_resume import _cli, _kill_mid_run

    data = _dataset(tmp_path, 120, 5)
    plan = tmp_path / "plan.parquet"
    runner = CliRunner()
    # No response cap at compile time: the run caps the plan's predictions at --max-new-tokens once, as
    # simulate caps the predictor's (a capped plan's means would be capped again).
    r = runner.invoke(main, ["compile", str(data), "--samples-per-prompt", "4", "--workers", "3", "-o", str(plan),
                             "--quiet"])  # fmt: skip
    assert r.exit_code == 0, r.output
    ref = tmp_path / "REF"
    first = runner.invoke(main, [*_run_roll_args(plan, data, ref), "--json"])
    assert first.exit_code == 0, first.output
    out = json.loads(first.stdout)
    held = out["epochs"][0]["samples_held"]
    assert held["kept"] + held["cut"] == 80 and held["kept"] > 0  # windows 2 and 3 of 40 prompts each scouted
    assert not (ref / "scout").exists()
    revisions = sorted(p.name for p in (ref / "epoch-1" / "plans").iterdir())
    assert revisions == [f"revision-{k}.parquet" for k in (1, 2)]
    for p in [ref / "plans" / "epoch-1.parquet", *(ref / "epoch-1" / "plans").iterdir()]:
        assert runner.invoke(main, ["check", str(p)]).exit_code == 0
    sim = runner.invoke(main, ["simulate", str(data), "--length-field", "lengths", "--samples-per-prompt", "4",
                               "--workers", "3", "--global-batch", "16", "--max-new-tokens", "1024",
                               "--strategies", "asp+scout+roll", "--scout-windows", "3", "--json", "--quiet"])  # fmt: skip
    assert sim.exit_code == 0, sim.output
    s = json.loads(sim.stdout)["strategies"]["asp+scout+roll"]
    assert out["mean_iteration_time"] == pytest.approx(s["mean_iteration_time"], rel=1e-9)
    assert held == {"kept": s["scout"]["responses_kept"], "cut": s["scout"]["responses_cut"]}
    assert runner.invoke(main, [*_run_roll_args(plan, data, ref, "--resume"), "--json"]).stdout == first.stdout
    ref_rows = _log_rows(ref)
    assert sum(k[0].endswith(X) for k in ref_rows) == 80
    killed = 0
    for seed in range(2):
        log = tmp_path / f"RUN{seed}"
        p = _cli(_run_roll_args(plan, data, log), env={TEST_DELAY_ENV: "0.02"})
        killed += _kill_mid_run(p, log / "epoch-1", float(np.random.default_rng(seed).uniform(0.0, 0.8)))
        p = _cli(_run_roll_args(plan, data, log, "--resume"))
        _, err = p.communicate()
        assert p.returncode == 0, err
        assert _log_rows(log) == ref_rows
    assert killed >= 1  # else this proves nothing
    # The policy's pairs leave the scout rows out; a second epoch plans from the first's groups.
    from aspc.predict.pairs import read_run_log_pairs

    got = read_run_log_pairs(ref / "epoch-1")
    assert len(got.ids) == 120 and not any(p.endswith(X) for p in got.ids)
    assert sorted(len(v) for v in got.lengths) == sorted([4] * 40 + [4 - int(k) for k in _kept_of(ref)])
    pairs = runner.invoke(main, ["predict", "train", str(ref / "epoch-1"), "--kind", "lexical", "-o",
                                 str(tmp_path / "pred"), "--quiet"])  # fmt: skip
    assert pairs.exit_code == 0, pairs.output
    # No static order stands for a plan revised inside the run: export refuses it in one line.
    bad = runner.invoke(main, ["export", str(ref / "plans" / "epoch-1.parquet"), "--format", "jsonl", "-o",
                               str(tmp_path / "x.jsonl"), "--no-source"])  # fmt: skip
    assert bad.exit_code != 0 and "rolling scout's plan" in bad.output and len(bad.output.strip().splitlines()) == 1
    assert not (tmp_path / "x.jsonl").exists()
    two = runner.invoke(main, [*_run_roll_args(plan, data, tmp_path / "TWO", "--epochs", "2"), "--json"])
    assert two.exit_code == 0, two.output
    assert [e["epoch"] for e in json.loads(two.stdout)["epochs"]] == [1, 2]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--scout-roll", "--log", "RUN"], "--scout-roll is a way of running the length scout: pass --scout too"),
        (["--scout", "--scout-windows", "3", "--log", "RUN"], "--scout-windows applies to --scout-roll"),
        (["--scout", "--scout-roll", "--scout-windows", "0", "--log", "RUN"], "--scout-windows must be an integer"),
        (["--scout", "--scout-roll", "--scout-keep", "--log", "RUN"], "drop --scout-keep"),
        (["--scout", "--scout-roll", "--replan", "--log", "RUN"], "drop --replan"),
        (["--scout", "--scout-roll", "--samples-per-prompt", "1", "--log", "RUN"], "--samples-per-prompt >= 2"),
    ],
)
def test_run_scout_roll_bad_options_fail_in_one_line_and_write_nothing(tmp_path, extra, message, monkeypatch):
    data = _dataset(tmp_path, 40, 2)
    plan = tmp_path / "plan.parquet"
    assert CliRunner().invoke(main, ["compile", str(data), "-o", str(plan), "--quiet"]).exit_code == 0
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(main, ["run", str(plan), "--actual-lengths", str(data), "--length-field", "lengths",
                                  "--global-batch", "8", *extra])  # fmt: skip
    assert r.exit_code == 2, r.output
    assert message in r.output and "Traceback" not in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1
    assert not (tmp_path / "RUN").exists()

def test_run_scout_roll_on_drawn_lengths_cuts_the_scouts(tmp_path):
    # Without recorded lengths the sim draws them from the predictions; a scout's are cut at T as a model
    # backend cuts them.
    from tests.realmodel import run_log_samples

    data = _dataset(tmp_path, 80, 6)
    plan = tmp_path / "plan.parquet"
    assert CliRunner().invoke(main, ["compile", str(data), "--samples-per-prompt", "3", "-o", str(plan),
                                     "--quiet"]).exit_code == 0  # fmt: skip
    r = CliRunner().invoke(main, ["run", str(plan), "--workers", "2", "--global-batch", "12", "--max-new-tokens", "2000",
                                  "--scout", "--scout-roll", "--scout-tokens", "64", "--log", str(tmp_path / "RUN"),
                                  "--quiet", "--json"])  # fmt: skip
    assert r.exit_code == 0, r.output
    rows = run_log_samples(tmp_path / "RUN" / "epoch-1")
    scouts = [s["response_len"] for s in rows if s["prompt_id"].endswith(X)]
    # 80 prompts: one window by default (one per 256 prompts), scouted first; some cut (drawn lengths run
    # to hundreds).
    assert len(scouts) == 80 and max(scouts) == 64
    assert max(s["response_len"] for s in rows if not s["prompt_id"].endswith(X)) > 64
    # The plan it wrote into its log holds the scout rows: not a plan to run or export (its 80 scout rows
    # became one-sample prompts); check still verifies it.
    written = tmp_path / "RUN" / "plans" / "epoch-1.parquet"
    assert CliRunner().invoke(main, ["check", str(written)]).exit_code == 0
    for cmd in (["run", str(written)], ["export", str(written), "-o", str(tmp_path / "e.pq")]):
        r = CliRunner().invoke(main, cmd)
        assert r.exit_code == 2 and "a rolling scout's plan" in r.output and "Traceback" not in r.output, r.output
        assert len(r.output.strip().splitlines()) == 1
    assert not (tmp_path / "e.pq").exists()


def test_a_capped_plan_is_not_capped_again(tmp_path):
    # cap_prediction shrinks a mean by its band's capped share each time it is applied; a planner starting
    # from a plan compiled with the run's cap (its stored means capped already) must not apply it again.
    import pyarrow.parquet as pq

    from aspc.caps import cap_for_plan, cap_prediction
    from aspc.predict.base import LengthPrediction

    p = LengthPrediction(np.array([900.0]), np.array([300.0]), np.array([800.0]), np.array([1000.0]))
    once = cap_prediction(p, 1024)
    assert cap_prediction(once, 1024).mean[0] < once.mean[0] < p.mean[0]  # why it must be applied once
    assert cap_for_plan({"max_response_length": 1024}, 1024) is None
    assert cap_for_plan({}, 1024) == 1024 and cap_for_plan({"max_response_length": 2048}, 1024) == 1024
    data = _dataset(tmp_path, 60, 4)
    plan = tmp_path / "plan.parquet"
    runner = CliRunner()
    assert runner.invoke(main, ["compile", str(data), "--samples-per-prompt", "3", "--max-response-length", "1024",
                                "-o", str(plan), "--quiet"]).exit_code == 0  # fmt: skip
    log = tmp_path / "RUN"
    args = _run_roll_args(plan, data, log)
    args[args.index("--samples-per-prompt") + 1] = "3"
    r = runner.invoke(main, args)
    assert r.exit_code == 0, r.output
    own = pq.read_table(plan).to_pydict()
    first = pq.read_table(log / "plans" / "epoch-1.parquet").to_pydict()
    want = dict(zip(own[S.PROMPT_ID], own[S.PREDICTED_LEN], strict=True))
    got = {p: v for p, v in zip(first[S.PROMPT_ID], first[S.PREDICTED_LEN], strict=True) if not p.endswith(X)}
    assert got == pytest.approx(want, rel=1e-12)  # the pending rows are the plan's own predictions


class _Groups(Trainer):
    """A user trainer (``--trainer tests.test_scout_roll:groups``) writing each batch's payload prompt ids to ``out``."""

    def __init__(self, out: str):
        self.out = out

    def step(self, batch):
        with open(self.out, "a") as f:
            f.write(json.dumps([p["prompt_id"] for p in batch.payload]) + "\n")
        return TrainResult(version=batch.step + 1, elapsed=0.0)


def groups(context, out):
    return _Groups(out)


def test_run_scout_roll_on_a_real_model(tmp_path):
    pytest.importorskip("torch", reason="needs torch: pip install 'aspc[hf]'")
    check_roll_on_a_real_model(tmp_path, [])


def check_roll_on_a_real_model(tmp_path: Path, engine: list[str]) -> None:
    """hf backend (``engine``: extra options, e.g. the Ray engine), a tiny random causal LM.

    Responses forced to their recorded lengths: a scout minibatch's responses
    stop at T, the rest at the run's cap; a kept response reaches the trainer
    named as its prompt, in the batch of its group's first sample.
    """
    from tests.realmodel import run_log_samples, tiny_model

    data = _dataset(tmp_path, 24, 9, k=4)
    recs = {json.loads(line)["id"]: json.loads(line)["lengths"] for line in open(data)}
    lens = {p: [max(1, round(v / 12)) for v in ls] for p, ls in recs.items()}  # ~20 tokens: a fast real run
    with open(data, "w") as f:
        for p, ls in lens.items():
            f.write(json.dumps({"id": p, "prompt": f"question {p}", "lengths": ls}) + "\n")
    plan = tmp_path / "plan.parquet"
    runner = CliRunner()
    assert runner.invoke(main, ["compile", str(data), "--samples-per-prompt", "3", "-o", str(plan),
                                "--quiet"]).exit_code == 0  # fmt: skip
    log = tmp_path / "RUN"
    r = runner.invoke(main, ["run", str(plan), "--backend", "hf", "--model", str(tiny_model(tmp_path)), *engine,
                             "--replay-lengths", "--actual-lengths", str(data), "--length-field", "lengths",
                             "--samples-per-prompt", "3", "--workers", "2", "--global-batch", "8",
                             "--max-new-tokens", "40", "--scout", "--scout-roll", "--scout-tokens", "12",
                             "--scout-windows", "2", "--trainer", "tests.test_scout_roll:groups",
                             "--trainer-arg", f"out={tmp_path / 'batches.jsonl'}",
                             "--log", str(log), "--json", "--quiet"])  # fmt: skip
    assert r.exit_code == 0, r.output
    rows = run_log_samples(log / "epoch-1")
    scouted = {s["prompt_id"][: -len(X)]: s for s in rows if s["prompt_id"].endswith(X)}
    assert len(scouted) == 12  # window 2 of 2 (the first is planned from the prior)
    assert {p: s["response_len"] for p, s in scouted.items()} == {p: min(lens[p][3], 12) for p in scouted}
    kept = {p for p in scouted if lens[p][3] < 12}
    assert 0 < len(kept) < 12
    group_rows = [s for s in rows if not s["prompt_id"].endswith(X)]
    assert len(group_rows) == 3 * 24 - len(kept)  # a kept response is its group's third sample
    assert max(s["response_len"] for s in group_rows) == min(max(max(ls[:3]) for ls in lens.values()), 40) > 12
    seen = [p for line in open(tmp_path / "batches.jsonl") for p in json.loads(line)]
    assert not any(p.endswith(X) for p in seen)  # every payload names its prompt, the kept ones too
    assert sorted(seen) == sorted(p for p in lens for _ in range(3))  # every group whole: 3 per prompt
    # Generated to EOS (no replay): the scout minibatches' responses stop at T all the same.
    free = runner.invoke(main, ["run", str(plan), "--backend", "hf", "--model", str(tiny_model(tmp_path)), *engine,
                                "--samples-per-prompt", "3", "--workers", "2", "--global-batch", "8",
                                "--max-new-tokens", "40", "--scout", "--scout-roll", "--scout-tokens", "12",
                                "--scout-windows", "2", "--log", str(tmp_path / "FREE"), "--json", "--quiet"])  # fmt: skip
    assert free.exit_code == 0, free.output
    rows = run_log_samples(tmp_path / "FREE" / "epoch-1")
    assert max(s["response_len"] for s in rows if s["prompt_id"].endswith(X)) <= 12
    assert max(s["response_len"] for s in rows if not s["prompt_id"].endswith(X)) > 12


def test_a_failed_minibatch_is_retried_around_the_revisions(tmp_path):
    # A worker raising on a scout minibatch and on later ones: each goes back to the dispatcher ahead of
    # the rest; a revision waits while one is pending (the remainder is not whole), and every hold holds.
    from aspc.runtime.backends.sim import SimBackend
    from aspc.runtime.lengths import join_actual_lengths
    from tests.test_runtime_resume import Flaky

    class _Following(Flaky):
        def on_revision(self, work, first, new_to_old):
            self.inner.on_revision(work, first, new_to_old)

    make, lens, kept = _roller(tmp_path, 90, 4, 3, 4, 2)
    roll = make()
    want = join_actual_lengths(work_from_table(roll.initial), lens, max_new_tokens=1024).response_len
    backend = _Following(SimBackend(SimCostModel(), want), fail={0: 1, 6: 2, 20: 1})
    rc = RunConfig(workers=3, global_batch=8, seed=2, max_new_tokens=1024, max_retries=2)
    res = run(roll.initial, config=rc, backend=backend, replanner=roll)
    assert backend.attempts[0] == 2 and backend.attempts[6] == 3 and backend.attempts[20] == 2
    assert res.summary.extra["worker_faults"] == 4
    smp, by_mb = _columns(res)
    _check_holds(roll, kept, 4, smp, by_mb)
    assert res.summary.n_trainer_steps == 4 * 90 // 8


def test_rolling_scout_under_a_bound_suggests_the_plain_scout(tmp_path):
    # Under --max-staleness the rolling scout keeps nothing, and the plain scout before the epoch was faster
    # at every bound measured: `run` and `simulate` say so in a note, and only then.
    data = _dataset(tmp_path, 60, 5)
    plan = tmp_path / "plan.parquet"
    runner = CliRunner()
    assert runner.invoke(main, ["compile", str(data), "-n", "4", "-o", str(plan), "--quiet"]).exit_code == 0
    common = ["--actual-lengths", str(data), "--length-field", "lengths", "--workers", "3", "--global-batch", "16",
              "--max-new-tokens", "1024"]  # fmt: skip
    for k, (bound, roll) in enumerate([([], True), (["--max-staleness", "4"], True), (["--max-staleness", "4"], False)]):
        strategies = ["--strategies", "random,asp+scout+roll", "--scout-windows", "3"] if roll else ["--strategies",
                                                                                                     "random,asp+scout"]
        r = runner.invoke(main, ["simulate", str(data), *common[2:], "--samples-per-prompt", "4", *strategies, *bound])
        assert r.exit_code == 0, r.output
        assert ("--scout without --scout-roll" in r.stderr) == (bool(bound) and roll), r.stderr
        r = runner.invoke(main, ["run", str(plan), *common, "--scout",
                                 *(["--scout-roll", "--scout-windows", "3"] if roll else []),
                                 "--log", str(tmp_path / f"RUN{k}"), *bound])  # fmt: skip
        assert r.exit_code == 0, r.output
        assert ("--scout without --scout-roll" in r.stderr) == (bool(bound) and roll), r.stderr
