"""Edges of the hf backend (``aspc run --backend hf``) found with a tiny random local model, on model
directories and prompts a user could give: each is refused in one line before the run log starts, or runs."""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

from aspc.cli import main
from tests.conftest import write_jsonl
from tests.realmodel import tiny_model

pytest.importorskip("transformers", reason="needs transformers: pip install 'aspc[hf]'")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("models"))


def _copy(model_dir, target):
    shutil.copytree(model_dir, target)
    return target


def _edit_json(path, **changes):
    data = json.loads(path.read_text())
    for k, v in changes.items():
        if v is None:
            data.pop(k, None)
        else:
            data[k] = v
    path.write_text(json.dumps(data))


def _plan(tmp_path, records, *extra):
    data = write_jsonl(tmp_path / "in.jsonl", records)
    plan = tmp_path / "plan.parquet"
    r = CliRunner().invoke(main, ["compile", str(data), "-o", str(plan), "-q", *extra])
    assert r.exit_code == 0, r.output
    return data, plan


def _run(plan, model, run_dir, *extra):
    return CliRunner().invoke(main, ["run", str(plan), "--backend", "hf", "--model", str(model), "--device", "cpu",
                                     "--workers", "1", "--global-batch", "2", "--max-new-tokens", "6",
                                     "--log", str(run_dir), "-q", *extra])


def _one_line_refusal(r, run_dir):
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert r.exit_code != 0, r.output
    assert "Traceback" not in r.output, r.output
    assert len(lines) == 1 and lines[0].startswith("Error: "), r.output
    assert not run_dir.exists(), "the run log was started before the input was refused"
    return lines[0]


def test_a_prompt_that_renders_to_no_tokens_is_refused_before_the_log_starts(tmp_path, model_dir):
    # A template that renders user turns only (and no generation prompt): a system-only chat becomes "".
    model = _copy(model_dir, tmp_path / "usertmpl")
    (model / "chat_template.jinja").write_text(
        "{% for m in messages %}{% if m['role'] == 'user' %}{{ m['content'] }}{% endif %}{% endfor %}")
    _, plan = _plan(tmp_path, [
        {"id": "s1", "messages": [{"role": "system", "content": "You are a bot."}]},
        {"id": "u1", "messages": [{"role": "user", "content": "Hello there friend"}]},
    ], "--batch-size", "2")
    run_dir = tmp_path / "RUN"
    r = _run(plan, model, run_dir)
    # Today: exit 0, and s1's "response" was generated from a row that is all padding (attention mask all 0).
    # With s1 alone in its minibatch: 'minibatch 0 failed 4 times ... RuntimeError: cannot reshape tensor of 0
    # elements', the log left failed.
    line = _one_line_refusal(r, run_dir)
    assert "'s1'" in line


def test_a_pad_token_past_the_embeddings_is_refused_before_the_log_starts(tmp_path, model_dir):
    from transformers import AutoTokenizer

    model = _copy(model_dir, tmp_path / "padout")
    tok = AutoTokenizer.from_pretrained(model)
    tok.add_special_tokens({"pad_token": "<newpad>"})  # id 100; the model has 100 embeddings
    tok.save_pretrained(model)
    # Prompts of different lengths in one minibatch: the shorter one is left-padded with the pad id.
    _, plan = _plan(tmp_path, [{"id": "a", "prompt": "a" * 40}, {"id": "b", "prompt": "hi"}], "--batch-size", "2")
    run_dir = tmp_path / "RUN"
    r = _run(plan, model, run_dir)
    # Today: 'minibatch 0 failed 4 times (--max-retries 3); last: worker 0: IndexError: index out of range in self'
    line = _one_line_refusal(r, run_dir)
    assert "pad" in line.lower() or "100" in line, line


def test_an_eos_id_past_the_embeddings_is_refused_before_a_replay_starts(tmp_path, model_dir):
    model = _copy(model_dir, tmp_path / "eosout")
    _edit_json(model / "generation_config.json", eos_token_id=[2, 500])
    data, plan = _plan(tmp_path, [{"id": "a", "prompt": "hello", "lengths": [3]},
                                  {"id": "b", "prompt": "hi there", "lengths": [5]}], "--length-field", "lengths")
    run_dir = tmp_path / "RUN"
    r = _run(plan, model, run_dir, "--actual-lengths", str(data), "--length-field", "lengths", "--replay-lengths")
    # Today: 'minibatch 0 failed 4 times ...; last: worker 0: IndexError: index 500 is out of bounds for dimension 0
    # with size 100', the log left failed.
    line = _one_line_refusal(r, run_dir)
    assert "500" in line


def test_eos_and_pad_declared_by_the_generation_config_are_enough(tmp_path, model_dir):
    model = _copy(model_dir, tmp_path / "genonly")
    _edit_json(model / "tokenizer_config.json", pad_token=None, eos_token=None)
    assert json.loads((model / "generation_config.json").read_text())["eos_token_id"] == 2
    _, plan = _plan(tmp_path, [{"id": "a", "prompt": "hello"}, {"id": "b", "prompt": "hi there"}])
    run_dir = tmp_path / "RUN"
    r = _run(plan, model, run_dir)
    # A tokenizer with a pad but no eos runs (eos from generation_config); one with neither is refused outright.
    assert r.exit_code == 0, r.output
    assert (run_dir / "meta.json").is_file()


def test_an_unreadable_generation_config_is_a_one_line_error(tmp_path, model_dir):
    model = _copy(model_dir, tmp_path / "badgen")
    (model / "generation_config.json").write_text("{bad")
    _, plan = _plan(tmp_path, [{"id": "a", "prompt": "hello"}, {"id": "b", "prompt": "hi there"}])
    run_dir = tmp_path / "RUN"
    r = _run(plan, model, run_dir)
    line = _one_line_refusal(r, run_dir)
    assert "generation_config.json" in line


_WRONG_SHAPE_TRAINER = '''
import torch
from aspc.runtime import Trainer, TrainResult


class T(Trainer):
    def step(self, batch):
        return TrainResult(version=batch.step + 1, elapsed=0.0,
                           weights={"model.norm.weight": torch.zeros(7)})  # the model's is (64,)


def make(context):
    return T()
'''


def test_published_weights_of_the_wrong_shape_are_named_like_unknown_ones(tmp_path, model_dir, monkeypatch):
    (tmp_path / "wrongshape_trainer.py").write_text(_WRONG_SHAPE_TRAINER)
    monkeypatch.syspath_prepend(str(tmp_path))
    _, plan = _plan(tmp_path, [{"id": f"p{i}", "prompt": f"question {i}"} for i in range(8)], "--batch-size", "2")
    r = _run(plan, model_dir, tmp_path / "RUN", "--trainer", "wrongshape_trainer:make", "--global-batch", "2")
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert r.exit_code != 0 and "Traceback" not in r.output, r.output
    assert len(lines) == 1, r.output
    # As for 'bogus.weight': "published weights hold 1 tensors the model does not have (e.g. 'bogus.weight'); the
    # trainer and --model must be the same architecture".
    assert "model.norm.weight" in lines[0] and "--model" in lines[0] and "torch.Size" not in lines[0], lines[0]


_FAILING_TRAINER = '''
from aspc.runtime import Trainer, TrainResult


class Failing(Trainer):
    def __init__(self, fail_at):
        self.fail_at = fail_at

    def step(self, batch):
        if batch.step == self.fail_at:
            raise RuntimeError("trainer lost")
        return TrainResult(version=batch.step + 1, elapsed=0.0)


def make(context, fail_at=-1):
    return Failing(int(fail_at))
'''


def _failed_run(tmp_path, model_dir, monkeypatch):
    """A chat plan's hf run on a copy of the tiny model, failed by its trainer at step 1: (model, plan, run dir)."""
    (tmp_path / "failing_trainer.py").write_text(_FAILING_TRAINER)
    monkeypatch.syspath_prepend(str(tmp_path))
    model = _copy(model_dir, tmp_path / "policy")
    _, plan = _plan(tmp_path, [{"id": f"c{i}", "messages": [{"role": "user", "content": f"question {i}"}]}
                               for i in range(8)], "--batch-size", "2")
    run_dir = tmp_path / "RUN"
    r = _run(plan, model, run_dir, "--trainer", "failing_trainer:make", "--trainer-arg", "fail_at=1")
    assert r.exit_code != 0 and json.loads((run_dir / "meta.json").read_text())["status"] == "failed", r.output
    return model, plan, run_dir


def test_resume_refuses_a_model_whose_chat_template_changed(tmp_path, model_dir, monkeypatch):
    model, plan, run_dir = _failed_run(tmp_path, model_dir, monkeypatch)
    # The policy's chat template is edited (another model's tokenizer copied in, a fixed template...).
    (model / "chat_template.jinja").write_text(
        "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} -- a much longer system preamble\n"
        "{% endfor %}{% if add_generation_prompt %}<|assistant|> {% endif %}")
    r = _run(plan, model, run_dir, "--trainer", "failing_trainer:make", "--resume")
    # Today: exit 0; the resumed samples' prompts were rendered by the new template (prompt_tokens 30 -> ~60).
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and "--model" in lines[0], r.output


def test_a_log_without_the_tokenizer_fingerprint_resumes_as_before(tmp_path, model_dir, monkeypatch):
    # Logs written before the key existed carry no tokenizer fingerprint: they are not compared on it.
    model, plan, run_dir = _failed_run(tmp_path, model_dir, monkeypatch)
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["run"]["sampling"]["tokenizer_fingerprint"]
    del meta["run"]["sampling"]["tokenizer_fingerprint"]
    (run_dir / "meta.json").write_text(json.dumps(meta))
    (model / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    r = _run(plan, model, run_dir, "--trainer", "failing_trainer:make", "--resume")
    assert r.exit_code == 0, r.output
    assert json.loads((run_dir / "meta.json").read_text())["status"] == "complete"


def test_the_tokenizer_fingerprint_follows_the_files_that_render_prompts(tmp_path, model_dir):
    from aspc.runtime.backends.models import model_fingerprint, tokenizer_fingerprint

    a, b = _copy(model_dir, tmp_path / "a"), _copy(model_dir, tmp_path / "b")
    assert tokenizer_fingerprint(a) == tokenizer_fingerprint(b) and tokenizer_fingerprint(tmp_path / "none") is None
    (b / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")
    assert tokenizer_fingerprint(a) != tokenizer_fingerprint(b) and model_fingerprint(a) == model_fingerprint(b)
    c = _copy(model_dir, tmp_path / "c")
    _edit_json(c / "tokenizer_config.json", eos_token="<pad>")
    assert tokenizer_fingerprint(a) != tokenizer_fingerprint(c)
    d = _copy(model_dir, tmp_path / "d")  # its end and pad ids (aspc.runtime.backends.special_ids)
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 3]}))
    assert tokenizer_fingerprint(a) != tokenizer_fingerprint(d) and model_fingerprint(a) == model_fingerprint(d)


def test_a_tokenizer_with_neither_pad_nor_eos_anywhere_is_still_refused(tmp_path, model_dir):
    from aspc.errors import BackendError
    from aspc.runtime.backends.models import load_tokenizer
    from aspc.runtime.backends.special_ids import special_ids

    class Model:  # declares no ids: neither its generation config nor its config
        generation_config = config = None

    model = _copy(model_dir, tmp_path / "noids")
    _edit_json(model / "tokenizer_config.json", pad_token=None, eos_token=None)
    with pytest.raises(BackendError, match="the tokenizer has neither a pad nor an eos token"):
        special_ids(load_tokenizer(model), Model(), model)
