"""Hunt 28: artifacts written by older aspc versions, read by this one (plans, run logs, epochs runs).

Each old-format artifact is built here with today's code and then altered exactly as a real artifact of the
named commit differs from today's (found by running that commit in a git worktree with today's venv and
diffing its outputs against this aspc's for the same commands and input, ``examples/prompts.jsonl``).
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tests.conftest import EXAMPLE, invoke_cli, one_line_error, trainer_failing_at


def failing_trainer(context, step: int = 3):
    """``--trainer tests.test_hunt28_versions:failing_trainer``: the sim trainer, failing at ``step``."""
    return trainer_failing_at(int(step))


def _prompts(tmp_path: Path, n: int) -> Path:
    data = tmp_path / "in.jsonl"
    with open(EXAMPLE, encoding="utf-8") as fh:
        data.write_text("".join(fh.readline() for _ in range(n)), encoding="utf-8")
    return data


def _compile(tmp_path: Path, data: Path, *args: object, name: str = "plan.parquet") -> Path:
    plan = tmp_path / name
    r = invoke_cli("compile", data, "--length-field", "lengths", "-b", 8, "--slack", 2, *args, "-o", plan, "-q")
    assert r.exit_code == 0, r.output
    return plan


def _edit_metadata(path: Path, edit) -> None:
    """Rewrite ``path``'s JSON metadata ``aspc.config`` / ``aspc.metrics`` with ``edit(config, metrics)``.

    The rows are untouched, so the stored rows hash stays valid (``aspc check`` passes the result).
    """
    table = pq.read_table(path)
    meta = dict(table.schema.metadata)
    config, metrics = json.loads(meta[b"aspc.config"]), json.loads(meta[b"aspc.metrics"])
    edit(config, metrics)
    meta[b"aspc.config"] = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
    meta[b"aspc.metrics"] = json.dumps(metrics, sort_keys=True, separators=(",", ":")).encode()
    pq.write_table(table.replace_schema_metadata(meta), path, compression="zstd")


def _stored(path: Path, key: bytes) -> dict:
    return json.loads(pq.read_schema(path).metadata[key])


def test_epochs_resume_of_a_run_an_older_aspc_started(tmp_path):
    """README: "a resume may still ask for more `--epochs`"; Reliability: a refusal says what is wrong and how to
    fix it. Upgrading aspc between the epochs of an ``--epochs`` run is the common case.

    Real artifacts: ``aspc run plan.parquet --epochs 2 --log runE`` (100 prompts) run by e0cd793 (2026-12-03),
    6a33327 (2026-12-06 03:09) and ddfbed4 (2026-12-06 21:37), then this aspc's ``aspc run plan.parquet
    --epochs 3 --log runE --resume`` (also ``--epochs 2 --resume`` of a run failed in epoch 2, and
    ``--scout --resume`` of 6a33327's scout run): every one is refused with "runE/plans/epoch-2.parquet: not the
    plan epoch 2 compiles from PLAN plan.parquet and the run logs before it (edited, or another PLAN or other
    options); resume with the PLAN and options the run started with, or pass --overwrite". Nothing was edited
    and PLAN and options are the originals: diffing ddfbed4's stored ``plans/epoch-2.parquet`` (identical to
    ``epoch-2/plan.parquet``; its rows hash verifies) against the plan this aspc compiles for it, config,
    ``prompt_id``, ``minibatch``, ``group`` and ``dispatch_rank`` are equal and only the last bits of
    ``predicted_len``/``predicted_q10/q50/q90`` (51-55 of 100 rows) and of four metrics differ (the pm.sum/mean/var
    commits of 2026-12-07). The line offers ``--overwrite``, which throws the finished epochs away, and sends the
    user to look for an edit or an option that does not exist (deleting ``plans/epoch-2.parquet`` by hand lets the
    resume recompile it and go on, checked on ddfbed4's failed run, but nothing says so).

    Built here: a complete 2-epoch run of this aspc, whose ``plans/epoch-2.parquet`` and ``epoch-2/plan.parquet``
    are rewritten with each predicted value moved by one ulp (what ddfbed4 wrote). Fixed: the resume goes on (the
    stored plan is intact and dispatches the same work), or refuses naming the cause (an older aspc compiled it).
    """
    from aspc.emit.plan import read_plan, write_plan

    data = _prompts(tmp_path, 100)
    plan = _compile(tmp_path, data)
    run = tmp_path / "runE"
    r = invoke_cli("run", plan, "--epochs", 2, "--global-batch", 16, "--log", run, "-q")
    assert r.exit_code == 0, r.output
    stored = read_plan(run / "plans" / "epoch-2.parquet")
    table = stored.table
    for name in ("predicted_len", "predicted_q10", "predicted_q50", "predicted_q90"):
        col = table.column(name).to_numpy()
        table = table.set_column(table.schema.get_field_index(name), name,
                                 pa.array(np.nextafter(col, np.inf), pa.float64()))  # fmt: skip
    old = dataclasses.replace(stored, table=table)
    for path in (run / "plans" / "epoch-2.parquet", run / "epoch-2" / "plan.parquet"):
        write_plan(old, path)
        assert invoke_cli("check", path).exit_code == 0  # an intact plan: its rows hash verifies
    r = invoke_cli("run", plan, "--epochs", 3, "--global-batch", 16, "--log", run, "--resume", "-q")
    if r.exit_code == 0:
        assert (run / "epoch-3" / "meta.json").is_file()
        return
    msg = one_line_error(r)
    assert "edited" not in msg and ("older aspc" in msg or "another aspc" in msg or "aspc version" in msg), msg


def test_epochs_of_a_plan_written_before_the_order_option_keep_its_order(tmp_path):
    """README: "several epochs (epoch 2 on, planned from the run log)"; aspc/epoch_staleness.py: later plans
    are compiled with "the plan's own" settings. Standard: an old key missing must not be replaced by a default
    that changes behaviour.

    Real artifact: ``aspc compile prompts.jsonl -o plan.parquet`` by fe1027d (2026-12-01 08:15, before the
    ``--order`` option; its compiler always dispatched in the interleaved order with heavy groups first, which
    is today's ``--order interleave``: fe1027d's ``--length-field lengths`` plan has the same ``prompt_id``,
    ``minibatch``, ``group`` and ``dispatch_rank`` as today's ``--order interleave`` plan of the same input, and
    differs from today's default lpt). Its metadata differs from today's in: no ``aspc.config`` ``order``, no
    ``aspc.metrics`` ``order``, ``aspc.config`` ``minibatch_cost`` where today writes ``cost_model``, and
    ``aspc.predictor`` ``format_version`` 1. This aspc reads it (check, inspect, run, export all work) but
    ``aspc run plan.parquet --epochs 2`` compiled ``plans/epoch-2.parquet`` with ``order: lpt`` (compile_config_of
    fills the missing key with CompileConfig's default): the run silently switches dispatch order at epoch 2
    (likewise ``--replan`` revisions and a ``--scout``'s epoch 1: checked on fe1027d's plan).

    Built here: today's ``--order interleave`` plan with those metadata keys removed/renamed. Fixed: epoch 2 is
    interleaved like the plan, or the run is refused in one line (recompile the plan).
    """
    data = _prompts(tmp_path, 100)
    plan = _compile(tmp_path, data, "--order", "interleave")

    def as_fe1027d(config, metrics):
        del config["order"], metrics["order"]
        config["minibatch_cost"] = config.pop("cost_model")

    _edit_metadata(plan, as_fe1027d)
    assert invoke_cli("check", plan).exit_code == 0
    run = tmp_path / "runE"
    r = invoke_cli("run", plan, "--epochs", 2, "--global-batch", 16, "--log", run, "-q")
    if r.exit_code != 0:
        one_line_error(r)
        return
    assert _stored(run / "plans" / "epoch-2.parquet", b"aspc.config")["order"] == "interleave"


def test_epochs_of_a_padded_cost_plan_keep_its_cost_model(tmp_path):
    """aspc/epoch_staleness.py: the run's later plans are compiled with "the plan's own" settings.

    Since b75d8f6 (2026-12-01, "config record keeps cost_model key") a plan's ``aspc.config`` stores
    CompileConfig.minibatch_cost under ``cost_model``; plans before it (fe1027d's, checked) store
    ``minibatch_cost``. ``replan.compile_config_of`` keeps only keys named like CompileConfig fields, so for
    every plan written since b75d8f6 (e0cd793, 6a33327, ddfbed4 and today's) the stored ``cost_model`` is dropped
    and the default ``expected-max`` used: ``aspc compile P --minibatch-cost padded -o plan.parquet`` then
    ``aspc run plan.parquet --epochs 2`` wrote ``plans/epoch-2.parquet`` with ``cost_model: expected-max``
    (config and metrics), silently (``--replan`` revisions and a ``--scout``'s epoch 1 likewise: checked).
    Fixed: epoch 2 keeps ``padded``.
    """
    data = _prompts(tmp_path, 100)
    plan = _compile(tmp_path, data, "--minibatch-cost", "padded")
    assert _stored(plan, b"aspc.config")["cost_model"] == "padded"
    run = tmp_path / "runE"
    r = invoke_cli("run", plan, "--epochs", 2, "--global-batch", 16, "--log", run, "-q")
    assert r.exit_code == 0, r.output
    epoch2 = run / "plans" / "epoch-2.parquet"
    assert _stored(epoch2, b"aspc.config")["cost_model"] == "padded"
    assert _stored(epoch2, b"aspc.metrics")["cost_model"] == "padded"


def _as_format_1_1(log: Path) -> None:
    """Rewrite a run log as an aspc before run log 1.2 (02e2ffe, 2026-12-01) wrote it (fe1027d, checked):
    ``format_version`` "1.1", no ``decode_time`` in samples parts, no ``plan_revision`` in minibatches parts,
    no ``plan.parquet`` copy, no ``config.max_staleness``/``speed_probe``, no ``run.replan_every``/``trainer``."""
    for kind, column in (("samples", "decode_time"), ("minibatches", "plan_revision")):
        for part in (log / kind).glob("part-*.parquet"):
            t = pq.read_table(part)
            pq.write_table(t.drop_columns([column]), part)
    (log / "plan.parquet").unlink(missing_ok=True)
    meta = json.loads((log / "meta.json").read_text())
    meta["format_version"] = "1.1"
    for where, key in (("config", "max_staleness"), ("config", "speed_probe"), ("run", "replan_every"),
                       ("run", "trainer")):  # fmt: skip
        meta[where].pop(key, None)
    (log / "meta.json").write_text(json.dumps(meta, indent=2, sort_keys=True))


def test_calibrate_of_a_format_1_1_log_prints_no_warning(tmp_path):
    """README: "Bad input gets a one-line error"; `--json` prints one JSON object and nothing else.

    Real artifact: ``aspc run plan.parquet --log run1`` by fe1027d (run log format 1.1). This aspc's
    ``aspc calibrate run1 --json`` printed "calibrate.py:379: RuntimeWarning: invalid value encountered in cast /
    revised = bool(np.any(np.asarray(mbs.get("plan_revision", ()), dtype=np.int64) > 0))" before its one-line
    refusal "Error: the run log has 7 minibatches; calibrating needs at least 8" (three lines), and before the
    result of a larger 1.1 log: the missing column is read as NaN and cast to int64 (whose value is then
    platform-defined). Built here: today's log rewritten as format 1.1 (see ``_as_format_1_1``). Fixed: no warning.
    """
    data = _prompts(tmp_path, 100)
    plan = _compile(tmp_path, data)
    log = tmp_path / "run1"
    r = invoke_cli("run", plan, "--log", log, "-q")
    assert r.exit_code == 0, r.output
    _as_format_1_1(log)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = invoke_cli("calibrate", log, "--json")
    assert r.exit_code == 0, r.output
    assert [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)] == []


def test_resume_of_an_old_log_made_with_the_older_default_cost_model(tmp_path):
    """README, Reliability: "**Resume** refuses another plan or configuration"; a refusal says what is wrong and
    how to fix it.

    Real artifact: ``aspc run plan_b8.parquet --global-batch 16 --trainer ... --log runF`` by fe1027d, failed at
    trainer step 3 (status failed, run log 1.1). Its ``meta.json`` ``cost_model`` is that aspc's default, with
    ``train_per_token`` 2.5e-05 (today's default is 1e-05, since dece72e "trainer beta 10us"); every other
    coefficient is equal. This aspc's ``aspc run plan_b8.parquet --global-batch 16 --log runF --resume`` (the
    original options) is refused: "this run differs from the logged one in the cost model; resume with the
    original options, or start a new run". The options are the original ones; what changed is aspc's default.
    The resume works with ``--cost-model FILE`` holding the logged coefficients (checked), which the line does
    not say, nor which coefficient differs (other options are named with both values).

    Built here: today's failed log with ``cost_model.train_per_token`` set to 2.5e-05. Fixed: the resume goes
    on with the logged model, or the line names the coefficient or ``--cost-model``.
    """
    data = _prompts(tmp_path, 100)
    plan = _compile(tmp_path, data)
    log = tmp_path / "runF"
    r = invoke_cli("run", plan, "--global-batch", 16, "--log", log, "-q",
                   "--trainer", "tests.test_hunt28_versions:failing_trainer")  # fmt: skip
    assert r.exit_code != 0
    meta = json.loads((log / "meta.json").read_text())
    assert meta["status"] == "failed", meta["status"]
    meta["cost_model"]["train_per_token"] = 2.5e-05
    (log / "meta.json").write_text(json.dumps(meta, indent=2, sort_keys=True))
    r = invoke_cli("run", plan, "--global-batch", 16, "--log", log, "--resume", "-q")
    if r.exit_code == 0:
        return
    msg = one_line_error(r)
    assert "train_per_token" in msg or "--cost-model" in msg, msg
    # The advice works: the logged coefficients as --cost-model.
    (tmp_path / "logged.json").write_text(json.dumps(meta["cost_model"]))
    r = invoke_cli("run", plan, "--global-batch", 16, "--log", log, "--resume", "--cost-model", tmp_path / "logged.json",
                   "-q")  # fmt: skip
    assert r.exit_code == 0, r.output
