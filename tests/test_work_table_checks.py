"""A plan table built by hand (the Python API) is refused by name where it lacks what the runtime reads."""

from __future__ import annotations

import pyarrow as pa
import pytest

from aspc.emit import read_plan
from aspc.errors import ConfigError, PlanError
from aspc.runtime.work import work_from_table
from tests.conftest import invoke_cli, lognormal_records, write_jsonl


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    d = tmp_path_factory.mktemp("w")
    data = write_jsonl(d / "in.jsonl", lognormal_records(30))
    assert invoke_cli("compile", data, "--length-field", "lengths", "-o", d / "p.parquet", "-q").exit_code == 0
    return read_plan(d / "p.parquet").table


def _with(t, name, values, typ):
    return t.set_column(t.column_names.index(name), name, pa.array(values, typ))


@pytest.mark.parametrize("edit, fragment", [
    (lambda t: t.drop(["n_samples"]), "plan has no 'n_samples' column"),
    (lambda t: t.drop(["group"]), "plan has no 'group' column"),
    (lambda t: t.drop(["prompt_tokens"]), "plan has no 'prompt_tokens' column"),
    (lambda t: _with(t, "prompt_tokens", [-1] * t.num_rows, pa.int64()), "holds a negative count"),
    (lambda t: _with(t, "prompt_tokens", [None] * t.num_rows, pa.int64()), "'prompt_tokens' holds nulls"),
    (lambda t: _with(t, "group", [0.5] * t.num_rows, pa.float64()), "'group' is double, not integers"),
    (lambda t: _with(t, "prompt_tokens", [2**64 - 1] * t.num_rows, pa.uint64()), "holds a value over 2\\*\\*31-1"),
])  # fmt: skip
def test_what_the_runtime_reads_is_checked(table, edit, fragment):
    # Each was a KeyError or a ValueError from the virtual-batch engine, deep in the run.
    with pytest.raises(PlanError, match=fragment):
        work_from_table(edit(table))


def test_a_compiled_plan_passes(table):
    assert work_from_table(table).n_samples.sum() > 0


@pytest.mark.parametrize("field, value, fragment", [
    ("global_batch", 64.5, "--global-batch must be an integer, got 64.5"),
    ("global_batch", "64", "--global-batch must be a number, got '64'"),
    ("global_batch", None, "--global-batch must be given"),
    ("reload_time", None, "--reload-time must be given"),
    ("worker_timeout", "5", "--worker-timeout must be a number"),
    ("max_new_tokens", 10**30, "--max-new-tokens must be >= 1 and <= 1000000000"),
    ("seed", -1, "--seed must be an integer in"),
    ("samples_per_prompt", 2.5, "--samples-per-prompt must be an integer"),
    ("workers", True, "--workers must be a number, got True"),
])  # fmt: skip
def test_a_run_config_from_python_gets_the_command_lines_guards(table, field, value, fragment):
    # Each was an AssertionError, TypeError or OverflowError inside the run, or ran silently (2.5 samples: 2).
    from aspc.runtime.api import run
    from aspc.runtime.config import RunConfig

    with pytest.raises(ConfigError, match=fragment.replace("(", r"\(")):
        run(table, config=RunConfig(**{field: value}))


@pytest.mark.parametrize("history", ["run1", ["run1", 3]])
def test_a_compile_config_history_that_is_not_a_list_of_paths_is_refused(history):
    # history="run1" was read as five files, one per character ("r: no such file").
    from aspc.compiler import CompileConfig, compile_file
    from aspc.io.options import InputOptions
    from tests.conftest import ROOT

    with pytest.raises(ConfigError, match="--history takes a list of paths"):
        compile_file(ROOT / "examples" / "prompts.jsonl", InputOptions(), CompileConfig(history=history))
