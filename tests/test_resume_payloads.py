"""A resumed run on a real backend hands its waiting samples to the trainer with their tokens (RUN/payloads/)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from aspc.errors import RunError
from aspc.runtime import BackendContext, RunConfig, Trainer, TrainResult, read_run_log, run
from aspc.runtime.record.payloads import PAYLOAD_DIR, PAYLOAD_FILE, PendingPayloads, read_payloads
from aspc.runtime.registry import make_backend
from tests.realmodel import small_plan, tiny_model

CAP = 24


class _Recording(Trainer):
    """Records every consumed sample's payload; raises at step ``fail_at`` (None: never)."""

    def __init__(self, fail_at: int | None = None):
        self.fail_at = fail_at
        self.seen: list[tuple[int, object]] = []  # (sample id, payload)

    def step(self, batch):
        if batch.step == self.fail_at:
            raise RuntimeError("the trainer's node went away")
        self.seen += list(zip(batch.samples.tolist(), batch.payload or [None] * len(batch.samples), strict=True))
        return TrainResult(version=batch.step + 1, elapsed=0.0)


def _backend(model_dir, lengths):
    return make_backend("hf", BackendContext(n_workers=2, options={
        "model": str(model_dir), "device": "cpu", "max_new_tokens": CAP, "temperature": 0.0, "replay": True,
        "replay_lengths": lengths}))  # fmt: skip


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    pytest.importorskip("transformers", reason="needs transformers: pip install 'aspc[hf]'")
    return tiny_model(tmp_path_factory.mktemp("models"))


def test_resumed_waiting_samples_reach_the_trainer_with_their_tokens(tmp_path, model_dir):
    table, lengths = small_plan(n_rows=16, rows_per_minibatch=2, n_samples=2, max_len=20)
    cfg = RunConfig(workers=2, global_batch=4, backend="hf", log_flush_seconds=0.0)
    log = tmp_path / "RUN"
    with pytest.raises(RunError, match="went away"):
        run(table, config=cfg, backend=_backend(model_dir, lengths), trainer=_Recording(fail_at=2), log_dir=log)
    meta = read_run_log(log, allow_incomplete=True)
    waiting = meta.tables["samples"].column("consumed_step").null_count
    assert waiting > 0, "no sample was waiting at the failure; the test needs a longer queue"
    stored = read_payloads(log)
    assert len(stored) >= waiting  # every waiting sample's payload, perhaps some consumed ones too

    trainer = _Recording()
    res = run(table, config=cfg, backend=_backend(model_dir, lengths), trainer=trainer, log_dir=log, resume=True)
    assert any("resumed" in n for n in res.notes) and not any("no stored payload" in n for n in res.notes)
    pids = table.column("prompt_id").to_pylist()
    n_samples = table.column("n_samples").to_pylist()
    name_of = [(p, k) for p, n in zip(pids, n_samples, strict=True) for k in range(int(n))]
    assert trainer.seen and all(p is not None for _, p in trainer.seen)  # the waiting ones too
    for sid, p in trainer.seen:
        assert p["prompt_id"] == name_of[sid][0]
        assert len(p["response_token_ids"]) == min(lengths[name_of[sid][0]][name_of[sid][1]], CAP) + p["finished"]
    restored = [(sid, p) for sid, p in trainer.seen if name_of[sid] in stored]
    assert len(restored) == waiting  # those came from the file, as the backend returned them
    assert all(p == stored[name_of[sid]] for sid, p in restored)
    assert not (log / PAYLOAD_DIR).exists()  # a complete run resumes nothing


class _Work:
    prompt_ids = np.array(["a", "b"])
    sample_row = np.array([0, 0, 1, 1])
    sample_index = np.array([0, 1, 0, 1])
    n_samples = np.array([2, 2])

    def row_first_samples(self):
        return np.array([0, 2])


def _parts(run_dir):
    return sorted(p.name for p in (run_dir / PAYLOAD_DIR).glob("part-*.parquet"))


def test_pending_payloads_are_written_once_in_parts_deleted_when_released(tmp_path):
    held = PendingPayloads()
    assert held.idle
    held.add(np.array([0, 1, 2, 3]), [{"t": [1]}, {"t": [2]}, {"x": object()}, {"t": [4]}])
    finished = np.array([True, True, True, False])
    held.write(tmp_path, finished, _Work())
    # Sample 2's payload is not JSON (not stored), sample 3's minibatch has not finished.
    assert read_payloads(tmp_path) == {("a", 0): {"t": [1]}, ("a", 1): {"t": [2]}} and _parts(tmp_path) == [
        "part-000000.parquet"]  # fmt: skip
    before = (tmp_path / PAYLOAD_DIR / "part-000000.parquet").stat().st_mtime_ns
    held.release(np.array([0]))
    held.write(tmp_path, finished, _Work())  # nothing new: nothing written, the part not rewritten
    assert _parts(tmp_path) == ["part-000000.parquet"]
    assert (tmp_path / PAYLOAD_DIR / "part-000000.parquet").stat().st_mtime_ns == before
    held.write(tmp_path, np.ones(4, dtype=bool), _Work())
    assert _parts(tmp_path) == ["part-000000.parquet", "part-000001.parquet"]
    held.release(np.array([1, 2]))  # part 0's samples all released: it goes
    assert read_payloads(tmp_path) == {("b", 1): {"t": [4]}}
    held.release(np.array([3]))
    assert _parts(tmp_path) == [] and read_payloads(tmp_path) == {} and held.idle


def test_a_resumed_run_adopts_the_parts_of_samples_its_log_holds(tmp_path):
    held = PendingPayloads()
    held.add(np.arange(4), [{"t": [i]} for i in range(4)])
    held.write(tmp_path, np.array([True, True, False, False]), _Work())
    held.write(tmp_path, np.ones(4, dtype=bool), _Work())  # as if its commit was cut off by a crash
    again = PendingPayloads()
    generated = np.array([1, 1, 0, 0])  # the log holds samples 0 and 1 only (0 consumed at step 0)
    again.adopt(tmp_path, {0: np.array([0, 1]), 1: np.array([2, 3])}, generated, np.array([0, -1, -1, -1]))
    assert _parts(tmp_path) == ["part-000000.parquet"]  # the crash's part goes: its samples are generated again
    again.add(np.array([2, 3]), [{"t": [20]}, {"t": [30]}])
    again.write(tmp_path, np.ones(4, dtype=bool), _Work())
    assert _parts(tmp_path) == ["part-000000.parquet", "part-000002.parquet"]  # numbers are never reused
    assert read_payloads(tmp_path)[("b", 0)] == {"t": [20]}
    again.release(np.array([1]), np.array([0]), 1)  # before the trainer is restored (a refused resume): kept
    assert _parts(tmp_path) == ["part-000000.parquet", "part-000002.parquet"]
    again.resumed()
    again.release(np.array([1]), np.array([0]), 1)  # step 0 durable, restorable: sample 0 (step 0) passed too
    assert _parts(tmp_path) == ["part-000002.parquet"]


def test_an_unreadable_payload_file_is_one_line(tmp_path):
    (tmp_path / PAYLOAD_FILE).write_bytes(b"PAR1 not parquet")
    with pytest.raises(RunError, match="delete the file to resume without them"):
        read_payloads(tmp_path)
    pq.write_table(pa.table({"prompt_id": ["a"], "sample_index": pa.array([0], pa.int32()),
                             "payload": pa.array(["{not json"], pa.large_string())}), tmp_path / PAYLOAD_FILE)  # fmt: skip
    with pytest.raises(RunError, match="cannot read"):
        read_payloads(tmp_path)


def test_a_run_without_a_log_holds_no_payloads():
    # Payloads are held only for a log's payload file: without one they would pile up over the run.
    from aspc.runtime.core.events import SamplesReturned
    from aspc.runtime.record.recorder import Recorder
    from aspc.runtime.work import work_from_table

    table, _ = small_plan(n_rows=4, rows_per_minibatch=2, n_samples=2)
    rec = Recorder(work_from_table(table))
    ids = np.arange(4, dtype=np.int64)
    rec.on_samples(SamplesReturned(1.0, 0, 0, ids, np.ones(4, dtype=np.int64), [{"t": [1]}] * 4))
    assert len(rec.payloads) == 0 and rec.payloads.idle


class _EveryN(_Recording):
    """A trainer restorable only at multiples of ``every`` (one that checkpoints every N steps); keeps each batch."""

    def __init__(self, every: int, fail_at: int | None = None):
        super().__init__(fail_at)
        self.every = every
        self.batches: dict[int, tuple] = {}
        self.restored: list[int] = []

    def durable(self, version):
        return version // self.every * self.every

    def restore(self, version):
        self.restored.append(version)

    def step(self, batch):
        result = super().step(batch)
        self.batches[batch.step] = (batch.samples.tolist(), batch.response_len.tolist(),
                                    batch.weights_version.tolist(), batch.payload)  # fmt: skip
        return result


def test_resume_replays_the_steps_after_the_trainers_newest_checkpoint(tmp_path, model_dir):
    """The log keeps the tokens of steps after the trainer's newest checkpoint; --resume takes those steps again."""
    import shutil

    table, lengths = small_plan(n_rows=16, rows_per_minibatch=2, n_samples=2, max_len=20)
    cfg = RunConfig(workers=2, global_batch=4, backend="hf", log_flush_seconds=0.0)
    log = tmp_path / "RUN"
    first = _EveryN(3, fail_at=5)
    with pytest.raises(RunError, match="went away"):
        run(table, config=cfg, backend=_backend(model_dir, lengths), trainer=first, log_dir=log)
    logged = read_run_log(log, allow_incomplete=True).tables["steps"].num_rows
    floor = logged // 3 * 3
    assert logged > floor, f"{logged} steps logged: the test needs one after the newest checkpoint"
    shutil.copytree(log, tmp_path / "COPY")

    second = _EveryN(3)
    res = run(table, config=cfg, backend=_backend(model_dir, lengths), trainer=second, log_dir=log, resume=True)
    assert second.restored == [floor]
    # The replayed steps: the same samples in the same order, lengths, versions and tokens as the first run's.
    for k in range(floor, logged):
        assert second.batches[k] == first.batches[k]
        assert all(p is not None for p in second.batches[k][3])
    assert sorted(second.batches) == list(range(floor, 32 // 4))
    assert any(f"restored weights version {floor}" in n for n in res.notes)
    assert not (log / PAYLOAD_DIR).exists()

    bad = _EveryN(3)  # the run's trainer class (a resume with another is refused), its durable() broken
    bad.durable = lambda version: version + 1

    with pytest.raises(RunError, match=rf"durable\({logged}\) returned {logged + 1}; it must be a version from 0"):
        run(table, config=cfg, backend=_backend(model_dir, lengths), trainer=bad, log_dir=tmp_path / "COPY",
            resume=True)  # fmt: skip


def test_consumed_payloads_stay_until_the_trainer_can_restore_past_them(tmp_path):
    held = PendingPayloads()
    held.durable = lambda version: version // 2 * 2  # a checkpoint every 2 steps
    held.add(np.arange(4), [{"t": [i]} for i in range(4)])
    held.write(tmp_path, np.array([True, True, False, False]), _Work())  # part 0: samples 0, 1
    held.write(tmp_path, np.ones(4, dtype=bool), _Work())  # part 1: samples 2, 3
    held.release(np.array([0, 1]), np.array([0, 0]), 1)  # step 0 logged; restorable: version 0
    assert _parts(tmp_path) == ["part-000000.parquet", "part-000001.parquet"]  # a resume replays step 0
    held.release(np.array([2]), np.array([1]), 2)  # version 2 restorable: steps 0 and 1 are past
    assert _parts(tmp_path) == ["part-000001.parquet"]
    held.release(np.array([3]), np.array([2]), 3)  # step 2 logged, version 2 restorable: kept for the replay
    assert _parts(tmp_path) == ["part-000001.parquet"]
    held.release(np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64), 4)
    assert _parts(tmp_path) == [] and held.idle
