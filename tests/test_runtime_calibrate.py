"""Calibration recovers the coefficients a simulated run log was generated with."""

from __future__ import annotations

import json

import numpy as np
import pytest

from aspc.errors import ConfigError, RunError
from aspc.runtime import RunConfig, run
from aspc.runtime.backends.sim_cost import SimCostModel, load_sim_cost_model, save_sim_cost_model
from aspc.runtime.calibrate import calibrate, calibrate_columns, nnls
from aspc.runtime.trainers.sim import SimTrainer
from aspc.testing.plans import synthetic_plan

TRUE = SimCostModel(
    decode_base=0.021,
    decode_per_seq=7e-5,
    decode_per_context_token=3e-8,
    prefill_base=0.05,
    prefill_per_token=2e-5,
    train_base=1.7,
    train_per_token=4e-6,
)


def test_calibrate_recovers_known_coefficients(tmp_path):
    # Minibatch sizes must vary, or prefill_base and decode_base are confounded
    # with the per-sequence terms; a few sizes is enough.
    table = synthetic_plan(1200, 12, n_samples=2, seed=9)
    run(table, config=RunConfig(workers=4, global_batch=24), sim_cost_model=TRUE, log_dir=tmp_path / "RUN")
    cal = calibrate(tmp_path / "RUN")
    got, want = cal.sim_cost_model.to_dict(), TRUE.to_dict()
    for k in want:
        assert got[k] == pytest.approx(want[k], rel=1e-5, abs=1e-12), k
    assert cal.r2_generation == pytest.approx(1.0)
    assert cal.generation_rel_error < 1e-9
    # The fitted model round-trips through JSON and reproduces the run.
    save_sim_cost_model(cal.sim_cost_model, tmp_path / "cost.json")
    assert load_sim_cost_model(tmp_path / "cost.json") == cal.sim_cost_model


def test_calibrate_needs_enough_minibatches():
    cols = {"end": np.ones(3), "start": np.zeros(3)}
    with pytest.raises(RunError, match="at least"):
        calibrate_columns(cols, {"end": np.ones(0), "start": np.zeros(0)})


def test_nnls_never_negative():
    rng = np.random.default_rng(0)
    x = rng.random((50, 3))
    y = x @ np.array([2.0, 0.0, 1.0]) - 0.3 * x[:, 1]
    coef = nnls(x, y)
    assert np.all(coef >= 0)
    assert coef[1] == 0


def test_cost_model_file_errors(tmp_path):
    p = tmp_path / "c.json"
    p.write_text(json.dumps({"decode_base": 0.1, "decode_bsae": 1}))
    with pytest.raises(ConfigError, match="unknown keys.*decode_bsae"):
        load_sim_cost_model(p)
    p.write_text(json.dumps({"decode_base": -1}))
    with pytest.raises(ConfigError, match=">= 0"):
        load_sim_cost_model(p)
    p.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_sim_cost_model(p)
    p.write_text(json.dumps({"train_base": 3}))
    assert load_sim_cost_model(p) == SimCostModel(train_base=3.0)


def test_resume_of_a_log_written_before_decode_times(tmp_path):
    # A run log of format 1.1 (sample rows without decode_time), killed mid-run, resumes with this aspc:
    # the old rows keep a null decode_time, the new ones get theirs, and calibrate reads the mix.
    import pyarrow.parquet as pq

    from aspc.runtime import read_run_log
    from aspc.runtime.engines.virtual import TEST_DELAY_ENV
    from tests.test_runtime_resume import _cli, _kill_mid_run, _plan_files, _sim_args, check_contract
    from tests.test_vllm_calibrate import _make_old_format

    data, plan, want = _plan_files(tmp_path, 120)
    run_dir = tmp_path / "RUN"
    for attempt in range(5):  # until a kill lands mid-run with some samples committed
        p = _cli([*_sim_args(plan, data, run_dir), "--overwrite"], env={TEST_DELAY_ENV: "0.02"})
        _kill_mid_run(p, run_dir, 0.3 + 0.2 * attempt)
        log = read_run_log(run_dir, allow_incomplete=True)
        if log.status == "running" and 0 < log.tables["samples"].num_rows < len(want):
            break
    else:
        pytest.skip("no kill landed mid-run on this machine")
    n_old = log.tables["samples"].num_rows
    _make_old_format(run_dir)
    assert all("decode_time" not in pq.read_schema(f).names for f in (run_dir / "samples").glob("*.parquet"))
    p = _cli([*_sim_args(plan, data, run_dir), "--resume"])
    _, err = p.communicate()
    assert p.returncode == 0, err
    check_contract(run_dir, want, 12)
    dec = read_run_log(run_dir).tables["samples"].column("decode_time")
    assert dec.null_count == n_old and len(dec) == len(want)
    cal = calibrate(run_dir)  # the rows with decode times are fitted; the old ones are left out
    assert cal.fit_rows == "samples" and cal.n_fit_rows == len(want) - n_old


def test_identical_minibatches_give_no_standard_errors_and_say_why(tmp_path):
    # Before: 200 copies of one prompt fitted prefill_base 0.505 ± 0.139 (true 0.01) and train_per_token
    # 4.3e-5 ± 3e-20 (true 1e-5): a split of the totals the log never measured, reported as exact.
    from tests.conftest import invoke_cli, write_jsonl

    src = write_jsonl(tmp_path / "same.jsonl", [{"id": str(i), "prompt": "same", "length": 100} for i in range(200)])
    plan = tmp_path / "p.parquet"
    assert invoke_cli("compile", src, "--length-field", "length", "-o", plan, "-q").exit_code == 0
    args = ("run", plan, "--actual-lengths", src, "--length-field", "length", "--log", tmp_path / "RUN", "-q")
    assert invoke_cli(*args).exit_code == 0
    cal = calibrate(tmp_path / "RUN")
    assert all(v is None for v in cal.std_errors.values()), cal.std_errors
    assert any("do not vary enough to separate the generation coefficients" in n for n in cal.notes)
    assert any("separate the trainer coefficients train_base, train_per_token" in n for n in cal.notes)
    # What the fit does measure still holds: the log's times are reproduced.
    assert cal.generation_rel_error < 1e-9


def test_varied_runs_keep_their_standard_errors(tmp_path):
    table = synthetic_plan(1200, 12, n_samples=2, seed=9)
    run(table, config=RunConfig(workers=4, global_batch=24), sim_cost_model=TRUE, log_dir=tmp_path / "RUN")
    cal = calibrate(tmp_path / "RUN")
    assert all(v is not None for v in cal.std_errors.values()), cal.std_errors
    assert not any("do not vary enough" in n for n in cal.notes)


@pytest.mark.parametrize("summary", [5, "x", [1], {"speed_probe_s": 3}, {"speed_probe_s": {"before": "x"}}])
def test_a_malformed_summary_is_no_speed_probe(tmp_path, summary):
    from aspc.runtime.calibrate import mean_speed_probe

    assert mean_speed_probe({"summary": summary}) is None


def test_a_huge_integer_coefficient_is_one_line(tmp_path):
    # math.isfinite() of a 400-digit JSON integer raised OverflowError: a traceback.
    p = tmp_path / "c.json"
    p.write_text('{"decode_per_seq": 1' + "0" * 400 + "}")
    with pytest.raises(ConfigError, match=r"must be <= 1e\+06 seconds, got an integer of 401 digits"):
        load_sim_cost_model(p)
    p.write_text('{"decode_per_seq": -1' + "0" * 400 + "}")
    with pytest.raises(ConfigError, match=r">= 0, got an integer of 401 digits$"):
        load_sim_cost_model(p)


def test_unseparated_needs_no_square_of_the_rows():
    # The full SVD built U of N x N: 47.7 GiB for a run of 80,000 samples ('out of memory').
    import tracemalloc

    from aspc.runtime.calibrate_fit import unseparated

    rng = np.random.default_rng(0)
    x = np.c_[np.ones(4000), rng.random(4000), rng.random(4000)]
    tracemalloc.start()
    try:
        got = unseparated(x, np.ones(3))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert not got.any() and peak < 16 * 2**20, peak  # U alone was 128 MB
    twin = np.c_[x[:, :2], x[:, 1]]  # two identical columns: neither can be told from the other
    assert unseparated(twin, np.ones(3)).tolist() == [False, True, True]


def test_a_fit_at_the_largest_coefficient_is_kept(tmp_path):
    # The fit of a run made with decode_base 1e6 came out 1000000.0000000001 and was refused,
    # with advice to fix a cost-model file that calibrate itself was writing.
    plan = synthetic_plan(200, 16, seed=0)
    edge = SimCostModel(decode_base=1e6)
    run(plan, config=RunConfig(workers=4, global_batch=32), sim_cost_model=edge, log_dir=tmp_path / "RUN")
    cal = calibrate(tmp_path / "RUN")
    assert cal.sim_cost_model.decode_base == pytest.approx(1e6) and cal.sim_cost_model.decode_base <= 1e6


class _FailsAtOnce(SimTrainer):
    def __init__(self):
        super().__init__(SimCostModel())

    def step(self, batch):
        raise RuntimeError("trainer lost")


def test_a_log_stopped_early_is_told_to_finish_not_to_run_a_larger_plan(tmp_path):
    # A killed or failed run whose log holds few minibatches yet: "run a larger plan" was wrong advice.
    table = synthetic_plan(1200, 12, n_samples=2, seed=9)
    with pytest.raises(RunError, match="trainer lost"):
        run(table, config=RunConfig(workers=4, global_batch=24), log_dir=tmp_path / "RUN", trainer=_FailsAtOnce())
    meta = json.loads((tmp_path / "RUN" / "meta.json").read_text())
    assert meta["status"] == "failed" and meta["run"]["n_minibatches"] >= 8
    with pytest.raises(RunError, match=r"minibatches so far \(status 'failed'\).*--resume") as err:
        calibrate(tmp_path / "RUN")
    assert "larger plan" not in str(err.value)
    (tmp_path / "ROOT").mkdir()  # an epoch's log resumes through its root, with --epochs
    (tmp_path / "RUN").rename(tmp_path / "ROOT" / "epoch-1")
    with pytest.raises(RunError, match=r"--log \S*ROOT --resume, with its --epochs and options"):
        calibrate(tmp_path / "ROOT" / "epoch-1")


def test_an_output_in_the_input_log_names_a_path_outside_it(tmp_path):
    # `calibrate RUN -o RUN` said "give a file path inside it", which the next check refused.
    from click.testing import CliRunner

    from aspc.cli import main

    run(synthetic_plan(1200, 12, n_samples=2, seed=9), config=RunConfig(workers=4, global_batch=24),
        log_dir=tmp_path / "RUN")  # fmt: skip
    (tmp_path / "RUN" / "sub").mkdir()
    for out, what in ((tmp_path / "RUN", "the input directory"), (tmp_path / "RUN" / "sub", "a directory inside")):
        r = CliRunner().invoke(main, ["calibrate", str(tmp_path / "RUN"), "-o", str(out)])
        assert r.exit_code == 2 and what in r.output and "give a file path outside it" in r.output, r.output
    r = CliRunner().invoke(main, ["calibrate", str(tmp_path / "RUN"), "-o", str(tmp_path)])  # a file inside is fine
    assert r.exit_code == 2 and "give a file path inside it" in r.output, r.output


def test_quiet_keeps_the_table_when_no_file_is_written(tmp_path):
    # Without -o the table is calibrate's result: -q printed nothing at all.
    from click.testing import CliRunner

    from aspc.cli import main

    run(synthetic_plan(1200, 12, n_samples=2, seed=9), config=RunConfig(workers=4, global_batch=24),
        log_dir=tmp_path / "RUN")  # fmt: skip
    loud = CliRunner().invoke(main, ["calibrate", str(tmp_path / "RUN")])
    quiet = CliRunner().invoke(main, ["calibrate", str(tmp_path / "RUN"), "-q"])
    assert loud.exit_code == quiet.exit_code == 0 and "coefficient" in quiet.stdout, quiet.output
    assert quiet.stdout == loud.stdout and not quiet.stderr, quiet.output
    written = CliRunner().invoke(main, ["calibrate", str(tmp_path / "RUN"), "-o", str(tmp_path / "c.json"), "-q"])
    assert written.exit_code == 0 and written.output == "" and (tmp_path / "c.json").exists(), written.output
