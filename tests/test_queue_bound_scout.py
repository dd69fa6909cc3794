"""The queue bound of ``aspc run`` with a rolling scout, as README "Running plans" states it.

Found by seeded random option combinations over tiny datasets (the README said "capacity + one minibatch"
for every run, which a rolling scout's held responses break).
"""

from __future__ import annotations

import json

import pyarrow.dataset as ds

from tests.conftest import invoke_cli


def _write(path, rows):
    with open(path, "w") as f:
        for pid, lengths in rows:
            f.write(json.dumps({"id": pid, "prompt": f"prompt {pid[1:]}", "lengths": lengths}) + "\n")
    return path


def test_scout_roll_queue_depth_stays_within_capacity_one_minibatch_and_the_held_responses(tmp_path):
    # Back-pressure counts queued plus in-flight samples. A rolling scout's held responses leave the in-flight
    # count when they return and join the queue when their group's row does, uncounted: counting them could
    # stop dispatch before the rows that release them (a deadlock). Depth 8 here under --queue-capacity 4,
    # minibatches of one sample, 4 held responses: within capacity + one minibatch + the held responses.
    data = _write(tmp_path / "d.jsonl", [(f"p{i}", [3] * 5) for i in range(4)])
    plan = tmp_path / "p.parquet"
    assert invoke_cli("compile", data, "--length-field", "lengths", "-n", 2, "-o", plan, "-q").exit_code == 0
    r = invoke_cli("run", plan, "--actual-lengths", data, "--length-field", "lengths", "-n", 2, "-w", 4,
                   "--global-batch", 2, "--queue-capacity", 4, "--max-new-tokens", 40, "--scout", "--scout-roll",
                   "--log", tmp_path / "R", "--json", "-q")  # fmt: skip
    assert r.exit_code == 0, r.output
    ep = json.loads(r.stdout)["epochs"][0]
    mb = ds.dataset(tmp_path / "R" / "epoch-1" / "minibatches").to_table()
    one_minibatch = max(mb.column("n_sequences").to_pylist())
    held = 4  # one kept scout response per prompt
    assert ep["queue_depth_max"] <= ep["queue_capacity"] + one_minibatch + held, (ep["queue_depth_max"], ep["queue_capacity"])
