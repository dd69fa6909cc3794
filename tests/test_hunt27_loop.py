"""Hunt 27: the learning loop fed from aspc's own run logs (``run --log`` / ``probe`` -> ``predict train|eval``
-> ``compile --predictor|--history``), sim backend, lexical predictors only."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import EXAMPLE, invoke_cli, one_line_error


def _prompts(tmp_path: Path, n: int) -> Path:
    """The first ``n`` prompts of the example file (each with a ``lengths`` list)."""
    data = tmp_path / "in.jsonl"
    with open(EXAMPLE, encoding="utf-8") as fh:
        data.write_text("".join(fh.readline() for _ in range(n)), encoding="utf-8")
    return data


def _run_log(tmp_path: Path, n: int = 60) -> tuple[Path, Path, Path]:
    data = _prompts(tmp_path, n)
    plan = tmp_path / "plan.parquet"
    r = invoke_cli("compile", data, "-o", plan, "-q")
    assert r.exit_code == 0, r.output
    log = tmp_path / "RUN"
    r = invoke_cli("run", plan, "--actual-lengths", data, "--length-field", "lengths", "--log", log, "-q")
    assert r.exit_code == 0, r.output
    return data, plan, log


def test_predict_eval_of_a_log_without_its_plan_names_a_fix_that_exists(tmp_path):
    """README, Learning the policy: "`aspc predict train` takes a run log (every committed sample; the prompt
    texts come from `RUN/plan.parquet`, which `aspc run --log` and `aspc probe` store, or `--plan PLAN`)";
    README, Run logs: "every reader (`report`, `calibrate`, `predict train|eval`, ...)". Standard: a bad input
    gets one line saying what is wrong and how to fix it.

    ``aspc run PLAN --log RUN`` that fails (a trainer error, a signal) leaves a log with committed samples but
    no ``RUN/plan.parquet`` (it is copied in only once the run completes); the log is simulated here by
    removing that file. ``aspc predict eval PRED RUN`` then says "no plan.parquet in the run log ...; pass
    --plan PLAN (the plan that was run)", and ``aspc predict eval PRED RUN --plan PLAN`` is refused by click:
    "No such option '--plan'". Either the advice must name a fix eval accepts, or eval must take --plan.
    """
    _, plan, log = _run_log(tmp_path)
    pred = tmp_path / "pred"
    r = invoke_cli("predict", "train", log, "-o", pred, "-q")
    assert r.exit_code == 0, r.output
    (log / "plan.parquet").unlink()
    msg = one_line_error(invoke_cli("predict", "eval", pred, log, "--json"))
    if "--plan" in msg:  # the advice given must work
        r = invoke_cli("predict", "eval", pred, log, "--plan", plan, "--json")
        assert r.exit_code == 0, r.output


def test_probe_resume_with_another_cap_blames_only_the_cap(tmp_path):
    """README, Reliability: "**Resume** refuses another plan or configuration ..., and `--actual-lengths` with
    other contents (sha256), another `--length-field`/`--id-field`, or other length values"; README, Learning
    the policy: "A probe stopped by a signal or a failure keeps its log ...: the same command with `--resume`
    generates only what is missing". Standard: the one-line error says what is wrong.

    ``aspc probe P --backend sim --actual-lengths P --length-field lengths --log PR -o pred/`` then the same
    with ``--max-new-tokens 100 --resume``: refused (right), but the line reads "this run differs from the
    logged one in --max-new-tokens (None in the log, 100 now); the actual lengths' values; ...". The lengths
    file is byte-identical (same name, same sha256, same field); only the cap changed. The same extra item
    appears for a resume with another --prompts (another plan) and for 'aspc run --resume' with another cap.
    """
    data = _prompts(tmp_path, 60)
    base = ["probe", data, "--backend", "sim", "--actual-lengths", data, "--length-field", "lengths",
            "--prompts", "60", "--log", tmp_path / "PR", "-o", tmp_path / "pred", "-q"]  # fmt: skip
    r = invoke_cli(*base)
    assert r.exit_code == 0, r.output
    msg = one_line_error(invoke_cli(*base, "--max-new-tokens", "100", "--resume"))
    assert "--max-new-tokens" in msg
    assert "actual lengths' values" not in msg, msg


def test_a_scout_runs_root_is_named_as_a_scout_run_with_its_scout_log(tmp_path):
    # The hunt's minor finding: given the root of an 'aspc run --scout' run, predict train said it held
    # "the 1 epoch logs of 'aspc run --epochs'" (no --epochs was given) and did not name RUN/scout.
    data = _prompts(tmp_path, 60)
    plan = tmp_path / "plan.parquet"
    assert invoke_cli("compile", data, "-o", plan, "-q").exit_code == 0
    root = tmp_path / "SC"
    r = invoke_cli("run", plan, "--scout", "--actual-lengths", data, "--length-field", "lengths", "--log", root, "-q")
    assert r.exit_code == 0, r.output
    msg = one_line_error(invoke_cli("predict", "train", root, "-o", tmp_path / "pred", "-q"))
    assert "'aspc run --scout'" in msg and str(root / "scout") in msg and str(root / "epoch-1") in msg, msg
    assert "--epochs" not in msg, msg


def test_history_from_a_rolling_scout_log_counts_each_prompt_once(tmp_path):
    # The hunt's minor finding: a rolling scout's log holds a scout row beside each prompt's rows; as
    # --history its scout ids were counted as observed prompts (n_observed 120 for 60 prompts).
    from aspc.emit import read_plan

    data = _prompts(tmp_path, 60)
    plan = tmp_path / "plan.parquet"
    assert invoke_cli("compile", data, "-n", "4", "-o", plan, "-q").exit_code == 0
    roll = tmp_path / "ROLL"
    r = invoke_cli("run", plan, "--scout", "--scout-roll", "--actual-lengths", data, "--length-field", "lengths",
                   "--log", roll, "-q")  # fmt: skip
    assert r.exit_code == 0, r.output
    out = tmp_path / "again.parquet"
    r = invoke_cli("compile", data, "--history", roll / "epoch-1", "-n", "4", "-o", out, "-q")
    assert r.exit_code == 0, r.output
    predictor = read_plan(out).predictor
    assert predictor["n_observed"] == 60, predictor
