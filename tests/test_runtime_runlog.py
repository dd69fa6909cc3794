"""The run log: layout, round trip, status marking, versions, bad input writes nothing."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.dataset as ds
import pytest

from aspc.errors import ConfigError, InputError, RunError, SchemaVersionError
from aspc.runtime import RunConfig, read_run_log, run, summarize_log
from aspc.runtime.backends.sim import SimBackend
from aspc.runtime.contracts import GenerationBackend
from aspc.runtime.record import runlog as R
from aspc.testing.plans import plan_table, synthetic_plan


def test_layout_columns_and_summary_round_trip(tmp_path):
    table = synthetic_plan(500, 16, n_samples=2, seed=4)
    res = run(table, config=RunConfig(workers=4, global_batch=32), log_dir=tmp_path / "RUN")
    root = tmp_path / "RUN"
    assert sorted(p.name for p in root.iterdir()) == ["meta.json", "minibatches", "queue", "samples", "steps"]
    meta = json.loads((root / "meta.json").read_text())
    assert meta["format"] == "aspc.runlog" and meta["status"] == "complete"
    assert meta["config"]["workers"] == 4 and meta["run"]["length_source"] == "sampled"
    samples = ds.dataset(root / "samples").to_table()
    for col in (
        "prompt_id",
        "sample_index",
        "response_len",
        "minibatch",
        "worker",
        "weights_version",
        "consumed_step",
    ):
        assert col in samples.column_names
    assert samples.num_rows == 1000
    log = read_run_log(root)
    assert summarize_log(log).to_dict() == {
        k: v for k, v in res.summary.to_dict().items() if k != "length_source"
    }
    assert meta["summary"]["mean_iteration_time"] == res.summary.mean_iteration_time
    mbs = R.to_columns(log.tables[R.MINIBATCHES])
    assert np.all(mbs["padded_tokens"] >= mbs["tokens"])


def test_lengths_read_back_from_a_run_log(tmp_path):
    from aspc.io import read_lengths

    table = synthetic_plan(100, 10, n_samples=3, seed=1)
    res = run(table, config=RunConfig(workers=2, global_batch=30), log_dir=tmp_path / "RUN")
    observed = read_lengths(tmp_path / "RUN")
    assert len(observed) == 100
    assert sum(v.size for v in observed.values()) == res.summary.samples_generated


class Exploding(GenerationBackend):
    """Generates three minibatches, then fails."""

    def __init__(self, inner: SimBackend):
        self.inner, self.calls = inner, 0
        self.clock = inner.clock

    def setup(self, work, n_workers):
        self.inner.setup(work, n_workers)

    def load_weights(self, worker, version, weights):
        return self.inner.load_weights(worker, version, weights)

    def generate(self, worker, work):
        self.calls += 1
        if self.calls > 3:
            raise RunError("worker 0 lost its device")
        return self.inner.generate(worker, work)


def test_failed_run_is_marked_failed_and_keeps_finished_parts(tmp_path):
    table = plan_table(np.arange(40) // 4, n_samples=1)
    lengths = {f"p{i:07d}": [10 + i] for i in range(40)}
    from aspc.runtime.backends.sim_cost import SimCostModel

    backend = Exploding(SimBackend(SimCostModel(), np.array([10 + i for i in range(40)]), reload_time=0.0))
    with pytest.raises(RunError, match="lost its device"):
        run(
            table,
            config=RunConfig(workers=1, global_batch=4),
            actual_lengths=lengths,
            backend=backend,
            log_dir=tmp_path / "RUN",
        )
    meta = json.loads((tmp_path / "RUN" / "meta.json").read_text())
    assert meta["status"] == "failed" and "lost its device" in meta["error"]
    with pytest.raises(RunError, match="not complete"):
        read_run_log(tmp_path / "RUN")
    log = read_run_log(tmp_path / "RUN", allow_incomplete=True)
    assert log.tables[R.MINIBATCHES].num_rows >= 1


@pytest.mark.parametrize(
    "config, lengths, error",
    [
        (RunConfig(workers=0), None, ConfigError),
        (RunConfig(global_batch=64, queue_capacity="63"), None, ConfigError),
        (RunConfig(global_batch=64, queue_capacity="0.5b"), None, ConfigError),
        (RunConfig(queue_capacity="lots"), None, ConfigError),
        (RunConfig(), {"p0000000": [5]}, InputError),
    ],
)
def test_bad_input_writes_no_log(tmp_path, config, lengths, error):
    table = plan_table(np.arange(8) // 2)
    with pytest.raises(error):
        run(table, config=config, actual_lengths=lengths, log_dir=tmp_path / "RUN")
    assert not (tmp_path / "RUN").exists()


def test_missing_lengths_message_names_count_and_example():
    table = plan_table(np.arange(8) // 2)
    with pytest.raises(InputError, match=r"7 of 8 plan prompts have no length.*'p0000001'"):
        run(table, actual_lengths={"p0000000": [5]})


def test_existing_directory_rules(tmp_path):
    table = plan_table(np.arange(8) // 2)
    other = tmp_path / "other"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    with pytest.raises(ConfigError, match="not empty"):
        run(table, log_dir=other)
    with pytest.raises(ConfigError, match="not an aspc run log"):
        run(table, log_dir=other, overwrite=True)
    assert (other / "keep.txt").read_text() == "mine"
    run(table, log_dir=tmp_path / "RUN")
    with pytest.raises(ConfigError, match="--overwrite"):
        run(table, log_dir=tmp_path / "RUN")
    run(table, log_dir=tmp_path / "RUN", overwrite=True)
    assert read_run_log(tmp_path / "RUN").status == "complete"


def test_reader_refuses_other_format_versions(tmp_path):
    run(plan_table(np.arange(8) // 2), log_dir=tmp_path / "RUN")
    meta_path = tmp_path / "RUN" / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["format_version"] = "2.0"
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(SchemaVersionError, match="newer"):
        read_run_log(tmp_path / "RUN")
    with pytest.raises(RunError, match="not an aspc run log"):
        read_run_log(tmp_path)
    # Readers that do not load the runtime (history, actual lengths, training pairs) refuse it too.
    from aspc.io.lengths import read_lengths
    from aspc.predict.pairs import read_run_log_pairs

    for read in (read_lengths, read_run_log_pairs):
        with pytest.raises(SchemaVersionError, match="run log format 2.0 is newer than this aspc"):
            read(tmp_path / "RUN")
    meta["format_version"] = "x"
    meta_path.write_text(json.dumps(meta))
    for read in (read_lengths, read_run_log_pairs):
        with pytest.raises(InputError, match="invalid run log format_version 'x'"):
            read(tmp_path / "RUN")


@pytest.mark.parametrize(
    "edit, want",
    [
        ({"config": {"workers": None}}, "config.workers must be an integer from 1 to 65536, got null"),
        ({"config": {"workers": "x"}}, "config.workers must be an integer from 1 to 65536, got \"x\""),
        ({"config": {"workers": -3}}, "config.workers must be an integer"),
        ({"config": {"workers": 0}}, "config.workers must be an integer"),
        ({"config": {"workers": 1e300}}, "config.workers must be an integer"),
        ({"config": {"workers": 10**20}}, "config.workers must be an integer"),
        ({"config": {"workers": True}}, "config.workers must be an integer"),
        ({"config": 5}, "meta.json config must be an object, got 5"),
        ({"run": 5}, "meta.json run must be an object, got 5"),
        ({"run": {"samples_planned": "x"}}, "run.samples_planned must be a non-negative integer"),
        ({"run": {"queue_capacity": -1}}, "run.queue_capacity must be a non-negative integer"),
    ],
)
def test_a_damaged_meta_of_an_interrupted_run_is_one_line_when_summarized(tmp_path, edit, want):
    # A killed run has no stored summary: recomputing it read config.workers and run.* unchecked, and a
    # hand-edited or damaged meta.json raised TypeError, ValueError, OverflowError or AttributeError.
    root = tmp_path / "RUN"
    run(synthetic_plan(60, 6, n_samples=2, seed=2), config=RunConfig(workers=2, global_batch=12), log_dir=root)
    meta = json.loads((root / "meta.json").read_text())
    meta["status"] = "running"
    del meta["summary"]
    for key, value in edit.items():
        meta[key] = meta[key] | value if isinstance(value, dict) else value
    (root / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(RunError) as err:
        summarize_log(read_run_log(root, allow_incomplete=True))
    msg = str(err.value)
    assert msg.startswith(f"{root}: meta.json ") and msg.endswith("; the run log is damaged") and "\n" not in msg
    assert want in msg, msg


def test_an_interrupted_run_without_run_or_config_sections_still_summarizes(tmp_path):
    root = tmp_path / "RUN"
    run(synthetic_plan(60, 6, n_samples=2, seed=2), config=RunConfig(workers=2, global_batch=12), log_dir=root)
    meta = json.loads((root / "meta.json").read_text())
    meta["run"], meta["config"] = None, {k: v for k, v in meta["config"].items() if k != "workers"}
    (root / "meta.json").write_text(json.dumps(meta))
    assert summarize_log(read_run_log(root)).n_workers == 1  # as before: absent means one worker
