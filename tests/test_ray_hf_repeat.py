"""hf sampling repeats sample for sample whatever the engine and the number of workers.

Each minibatch draws from a generator seeded by (--seed, the run's seed,
minibatch), built in the process that generates it: a Ray actor must draw
what a local worker thread draws, one actor serving every minibatch (-w 1)
what two actors serving half each (-w 2) draw, and actors kept from epoch 1
what they would have drawn fresh. One local Ray instance (2 CPUs) serves the
module, as in test_ray_engine.
"""

from __future__ import annotations

import pyarrow.dataset as ds
import pytest
from click.testing import CliRunner

from aspc.cli import main
from tests.conftest import write_jsonl
from tests.realmodel import tiny_model

ray = pytest.importorskip("ray", reason="needs ray: pip install 'aspc[ray]'")
pytest.importorskip("transformers", reason="needs transformers: pip install 'aspc[hf]'")

CAP = 64  # the tiny model ends about half its samples before it


@pytest.fixture(scope="module")
def ray_session():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


def _lengths(run_dir) -> dict[tuple[str, str, int], int]:
    """(epoch folder, prompt id, sample index) -> response length, over every epoch of a run log."""
    out = {}
    for samples in sorted(run_dir.rglob("samples")):
        where = str(samples.parent.relative_to(run_dir))
        for s in ds.dataset(str(samples), format="parquet").to_table().to_pylist():
            out[(where, s["prompt_id"], s["sample_index"])] = s["response_len"]
    return out


def test_sampled_lengths_are_the_same_on_ray_with_one_or_two_workers_and_locally(tmp_path, ray_session):
    model = tiny_model(tmp_path)
    records = [{"id": f"q{i:02d}", "prompt": f"question {i}: " + "x" * (i % 7 + 1), "lengths": [10 + i] * 4}
               for i in range(12)]  # fmt: skip
    data = write_jsonl(tmp_path / "IN.jsonl", records)
    plan = tmp_path / "plan.parquet"
    r = CliRunner().invoke(main, ["compile", str(data), "--length-field", "lengths", "--samples-per-prompt", "4",
                                  "--batch-size", "4", "-o", str(plan), "--quiet"])  # fmt: skip
    assert r.exit_code == 0, r.output
    got = {}
    for engine in ("local", "ray"):
        for workers in (1, 2):
            run_dir = tmp_path / f"RUN-{engine}-{workers}"
            r = CliRunner().invoke(main, [
                "run", str(plan), "--backend", "hf", "--engine", engine, "--model", str(model), "--device", "cpu",
                "--temperature", "1.0", "--seed", "7", "--workers", str(workers), "--global-batch", "8",
                "--max-new-tokens", str(CAP), "--epochs", "2", "--log", str(run_dir), "-q"])  # fmt: skip
            assert r.exit_code == 0, r.output
            got[(engine, workers)] = _lengths(run_dir)
    want = got[("local", 1)]
    assert len(want) == 2 * 12 * 4  # two epochs of every sample
    lengths = list(want.values())
    assert min(lengths) < CAP and lengths.count(CAP) > 0  # sampled: some end early, some run to the cap
    for key, lens in got.items():
        differ = sorted(k for k in want if lens.get(k) != want[k])
        assert differ == [], f"{key}: {len(differ)} of {len(want)} lengths differ from local -w 1, e.g. {differ[:3]}"
