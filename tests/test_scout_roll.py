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
from aspc.errors import ConfigError, PlanError
from aspc.rolling_scout import SCOUT_ID_SUFFIX
from aspc.runtime import RunConfig, run
from aspc.runtime.backends.sim_cost import SimCostModel
from aspc.runtime.hold import holds_for
from aspc.runtime.trainers.sim import SimTrainer
from aspc.runtime.work import work_from_table
from aspc.simulate import comparison_table, simulate_strategies


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


# Scout minibatch 0 (prompts a, b; b's response is cut), an unrelated long minibatch 1, then the groups
# of a (one sample fewer: the scout's is its last) and b (all of its samples) in minibatch 2.
_ROWS = [("a#s", 1, 0), ("b#s", 1, 0), ("c", 3, 1), ("a", 2, 2), ("b", 3, 2)]
_LENGTHS = {"a#s": [50.0], "b#s": [60.0], "c": [900.0, 800.0, 700.0], "a": [40.0, 45.0], "b": [30.0, 35.0, 33.0]}
_SCOUT = np.array([True, True, False, False, False])
_KEEP_FOR = np.array([3, -1, -1, -1, -1])


def _columns(res, plan: pa.Table):
    smp = res.columns["samples"]
    n = plan.column(S.N_SAMPLES).to_numpy()
    pid = np.repeat(np.asarray(plan.column(S.PROMPT_ID).to_pylist(), dtype=object), n)
    mbs = res.columns["minibatches"]
    by_mb = {int(m): (float(s), float(e), int(v)) for m, s, e, v in
             zip(mbs["minibatch"], mbs["start"], mbs["end"], mbs["weights_version"], strict=True)}  # fmt: skip
    return smp, pid, by_mb


@pytest.mark.parametrize("mode", ["static", "continuous"])
def test_a_held_sample_is_consumed_with_its_group_and_a_cut_one_never(mode):
    plan = _plan(_ROWS)
    rc = RunConfig(workers=2, global_batch=3, seed=0, return_mode=mode)
    res = run(plan, config=rc, actual_lengths=_LENGTHS, scout_rows=_SCOUT, keep_for=_KEEP_FOR)
    smp, pid, by_mb = _columns(res, plan)
    step = np.asarray(smp["consumed_step"])
    version = np.asarray(smp["weights_version"])
    # Sample ids: a#s 0, b#s 1, c 2-4, a 5-6, b 7-9.
    assert step[1] == -1  # the cut scout response is never a training sample
    assert step[0] >= 0 and step[5] - 1 <= step[0] <= step[5]  # queued right before its group's first sample
    assert version[0] == by_mb[0][2] and np.asarray(smp["policy_lag"])[0] == step[0] - version[0]
    assert by_mb[2][0] >= by_mb[0][1]  # the groups planned from the scout start after it ended
    assert res.summary.n_trainer_steps == 3  # 9 samples queued (8 generated for groups + the kept one)
    assert res.summary.extra["samples_held"] == {"kept": 1, "cut": 1}


def test_a_minibatch_waits_for_its_scout_even_with_a_worker_idle():
    # Two workers: minibatch 1 (the scout) is long; minibatch 2 needs it and must not start on the idle
    # worker before it ends, although plan order and capacity would allow it.
    plan = _plan([("x", 1, 0), ("s#s", 1, 1), ("s", 1, 2), ("y", 1, 3)])
    lens = {"x": [10.0], "s#s": [2000.0], "s": [10.0], "y": [10.0]}
    res = run(plan, config=RunConfig(workers=2, global_batch=1, seed=0), actual_lengths=lens,
              scout_rows=np.array([False, True, False, False]), keep_for=np.array([-1, 2, -1, -1]))  # fmt: skip
    _, _, by_mb = _columns(res, plan)
    assert by_mb[2][0] >= by_mb[1][1] > by_mb[0][1]
    assert by_mb[3][0] >= by_mb[2][0]  # plan order is kept behind the gate


def test_bad_marks_are_plan_errors():
    work = work_from_table(_plan(_ROWS))
    with pytest.raises(PlanError, match="3 scout marks and 5 targets for 5 plan rows"):
        holds_for(work, _SCOUT[:3], _KEEP_FOR)
    with pytest.raises(PlanError, match="exactly one sample"):
        holds_for(work, np.array([True, False, True, False, False]), np.array([3, -1, 4, -1, -1]))
    with pytest.raises(PlanError, match="earlier minibatch"):
        holds_for(work_from_table(_plan([("a", 1, 0), ("a#s", 1, 1)])), np.array([False, True]), np.array([-1, 0]))
    with pytest.raises(PlanError, match="kept for one row"):
        holds_for(work, np.array([True, True, False, False, False]), np.array([3, 3, -1, -1, -1]))
    with pytest.raises(PlanError, match="itself a scout row"):
        holds_for(work, _SCOUT, np.array([1, -1, -1, -1, -1]))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"config": RunConfig(workers=2, global_batch=3, max_staleness=2)}, "--max-staleness"),
        ({"carried": np.array([-1, -1, -1, 5, -1])}, "drop the carried responses"),
        ({"keep_for": None}, "needs both"),
        ({"config": RunConfig(workers=2, global_batch=3, backend="hf")}, "simulated only"),
    ],
)
def test_the_runtime_refuses_what_it_cannot_hold(tmp_path, changes, message):
    kwargs = {"config": RunConfig(workers=2, global_batch=3), "actual_lengths": _LENGTHS, "scout_rows": _SCOUT,
              "keep_for": _KEEP_FOR, **changes}  # fmt: skip
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


def _rolled(tmp_path: Path, n_prompts: int, n: int, workers: int, windows: int, seed: int):
    """A rolling plan of a generated dataset, the lengths its rows replay, and whether each prompt's scout is kept."""
    from aspc.compiler import prepare
    from aspc.rolling_scout import rolling_plan

    path = _dataset(tmp_path, n_prompts, seed, k=n + 1)
    recs = [json.loads(line) for line in open(path)]
    cfg = CompileConfig(samples_per_prompt=n, seed=seed, workers=workers, max_response_length=1024)
    table, prior, _ = prepare(path, InputOptions(), cfg)
    spare = np.array([float(r["lengths"][n]) for r in recs])
    rolled = rolling_plan(table, prior, spare, cfg, workers, 256, windows, {})
    plan = rolled.table
    ids = plan.column(S.PROMPT_ID).to_pylist()
    n_rows = plan.column(S.N_SAMPLES).to_numpy()
    kept = spare < 256
    assert sorted(p for p in ids if p.endswith(SCOUT_ID_SUFFIX)) == sorted(r["id"] + SCOUT_ID_SUFFIX for r in recs)
    assert np.array_equal(n_rows[~rolled.scout_rows], np.where(kept[rolled.source[~rolled.scout_rows]], n - 1, n))
    lens = {p: [min(spare[src], 256)] if rolled.scout_rows[i] else recs[src]["lengths"][:k]
            for i, (p, src, k) in enumerate(zip(ids, rolled.source.tolist(), n_rows.tolist(), strict=True))}  # fmt: skip
    return rolled, lens, kept


def _check_holds(rolled, kept, smp, by_mb) -> None:
    """Every hold and gate of ``rolled`` against a run's sample columns (plan order) and minibatch rows."""
    plan = rolled.table
    n_rows = plan.column(S.N_SAMPLES).to_numpy()
    row_mb = plan.column(S.MINIBATCH).to_numpy()
    first = np.r_[0, np.cumsum(n_rows)[:-1]]
    step, version = np.asarray(smp["consumed_step"]), np.asarray(smp["weights_version"])
    lag = np.asarray(smp["policy_lag"])
    assert np.all(lag[step >= 0] == (step - version)[step >= 0])
    for r in np.flatnonzero(rolled.scout_rows):
        target = rolled.keep_for[r]
        assert version[first[r]] == by_mb[int(row_mb[r])][2]  # generated by the scout minibatch's weights
        if target < 0:
            assert not kept[rolled.source[r]] and step[first[r]] == -1  # a cut scout is never a sample
            continue
        assert kept[rolled.source[r]] and rolled.source[target] == rolled.source[r]
        assert by_mb[int(row_mb[target])][0] >= by_mb[int(row_mb[r])][1]  # planned from it: starts after it ends
        if step[first[target]] >= 0:  # consumed with its group: in its first sample's step or the one before
            assert step[first[target]] - 1 <= step[first[r]] <= step[first[target]]


def _checked_roll(tmp_path: Path, n_prompts: int, n: int, workers: int, gb: int, windows: int, mode: str, seed: int):
    """The rolling plan run on its own, every gate and hold checked against the run's columns."""
    rolled, lens, kept = _rolled(tmp_path, n_prompts, n, workers, windows, seed)
    plan = rolled.table
    rc = RunConfig(workers=workers, global_batch=gb, seed=seed, max_new_tokens=1024, return_mode=mode)
    res = run(plan, config=rc, actual_lengths=lens, scout_rows=rolled.scout_rows, keep_for=rolled.keep_for)
    smp, _, by_mb = _columns(res, plan)
    _check_holds(rolled, kept, smp, by_mb)
    # n samples of every prompt reach the queue (cut scouts never): the trainer steps of a plain run.
    assert res.summary.n_trainer_steps == n * n_prompts // gb
    assert res.summary.extra["samples_held"] == {"kept": int(kept.sum()), "cut": int((~kept).sum())}
    return rolled, res


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


class _StopAt(SimTrainer):
    """The sim trainer, failing at one step: the run stops part-way with a resumable log."""

    def __init__(self, at: int):
        super().__init__(SimCostModel())
        self.at = at

    def step(self, batch):
        if batch.step == self.at:
            raise RuntimeError("trainer lost")
        return super().step(batch)


@pytest.mark.parametrize(("mode", "at"), [("static", 3), ("static", 11), ("continuous", 7)])
def test_a_failed_rolling_run_resumes_with_its_holds(tmp_path, mode, at):
    import pyarrow.dataset as ds

    rolled, lens, kept = _rolled(tmp_path, 90, 4, 3, 4, 1)
    rc = RunConfig(workers=3, global_batch=8, seed=1, max_new_tokens=1024, return_mode=mode, log_flush_seconds=0.0)
    args = {"config": rc, "actual_lengths": lens, "scout_rows": rolled.scout_rows, "keep_for": rolled.keep_for,
            "log_dir": tmp_path / "RUN"}  # fmt: skip
    with pytest.raises(RuntimeError, match="trainer lost"):
        run(rolled.table, **args, trainer=_StopAt(at))
    assert json.loads((tmp_path / "RUN" / "meta.json").read_text())["status"] == "failed"
    with pytest.raises(ConfigError, match="the rolling scout"):  # another hold setting: refused, log kept
        run(rolled.table, **{**args, "keep_for": np.where(rolled.keep_for >= 0, -1, -1)}, resume=True)
    res = run(rolled.table, **args, resume=True)
    assert res.summary.n_trainer_steps == 4 * 90 // 8
    rows = ds.dataset(str(tmp_path / "RUN" / "samples")).to_table().to_pydict()
    ids = rolled.table.column(S.PROMPT_ID).to_pylist()
    n_rows = rolled.table.column(S.N_SAMPLES).to_numpy()
    gid = {(p, i): g for g, (p, i) in enumerate((p, i) for p, k in zip(ids, n_rows, strict=True) for i in range(k))}
    order = np.array([gid[(p, i)] for p, i in zip(rows["prompt_id"], rows["sample_index"], strict=True)])
    assert np.array_equal(np.sort(order), np.arange(len(gid)))  # every sample once
    smp = {k: np.asarray([-1 if v is None else v for v in rows[k]])[np.argsort(order)]
           for k in ("consumed_step", "weights_version", "policy_lag")}  # fmt: skip
    mbs = ds.dataset(str(tmp_path / "RUN" / "minibatches")).to_table().to_pydict()
    by_mb = {int(m): (float(s), float(e), int(v)) for m, s, e, v in
             zip(mbs["minibatch"], mbs["start"], mbs["end"], mbs["weights_version"], strict=True)}  # fmt: skip
    _check_holds(rolled, kept, smp, by_mb)


def test_later_scouts_run_inside_the_epoch(tmp_path):
    rolled, _ = _checked_roll(tmp_path, 120, 4, 3, 8, 4, "static", 3)
    row_mb = rolled.table.column(S.MINIBATCH).to_numpy()
    scout_mbs = sorted({int(m) for m in row_mb[rolled.scout_rows]})
    rest_mbs = sorted({int(m) for m in row_mb[~rolled.scout_rows]})
    assert scout_mbs[0] == 0 and scout_mbs[-1] > rest_mbs[0]  # window 1's scout first, the others within
    assert rolled.windows == 4


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
        (["--max-staleness", "2"], "does not combine with --max-staleness"),
        (["--samples-per-prompt", "1"], "needs --samples-per-prompt >= 2 (got 1)"),
    ):
        bad = runner.invoke(main, [*args, *extra])
        assert bad.exit_code != 0 and message in bad.output and "Traceback" not in bad.output, bad.output
        assert len(bad.output.strip().splitlines()) == 1
    no_roll = [*args[:-2], "random,asp", "--json", "--scout-windows", "3"]
    bad = runner.invoke(main, no_roll)
    assert bad.exit_code != 0 and "--scout-windows applies to the asp+scout+roll strategy" in bad.output
