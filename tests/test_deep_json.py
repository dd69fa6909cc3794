"""JSON nested past Python's parser in files and values a user hands aspc: one line, never a RecursionError traceback.

``json.loads`` raises RecursionError (not a ValueError) on valid JSON nested ~100,000 deep (less on a
small stack), so each reader that words a JSONDecodeError must word that too.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from aspc.cli import main as cli
from aspc.errors import BackendError, ConfigError, RunError
from aspc.io.rows import chat_messages
from aspc.runtime.backends.models import check_causal_lm
from aspc.runtime.backends.vllm_args import parse_engine_args
from aspc.runtime.record.payloads import PAYLOAD_FILE, read_payloads

DEEP = "[" * 100_000 + "]" * 100_000
PROMPTS = Path(__file__).resolve().parent.parent / "examples" / "prompts.jsonl"


def _one_line_error(result) -> str:
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(lines) == 1, result.output
    return lines[0]


def test_text_that_opens_like_a_chat_and_nests_deep_is_text():
    # Was: chat_messages (run backends, exports) raised RecursionError on such a text prompt.
    assert chat_messages('[{"role":' + "[" * 100_000) is None


@pytest.fixture(scope="module")
def deep_run_log(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("deep")
    runner = CliRunner()
    plan = d / "plan.parquet"
    r = runner.invoke(cli, ["compile", str(PROMPTS), "--length-field", "lengths", "-o", str(plan), "--quiet"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(cli, ["run", str(plan), "--log", str(d / "RUN"), "--quiet"])
    assert r.exit_code == 0, r.output
    (d / "RUN" / "meta.json").write_text(DEEP, encoding="utf-8")
    return d / "RUN"


def test_training_pairs_from_a_run_log_with_deep_meta_json_is_one_line(deep_run_log, tmp_path):
    # Was: a RecursionError traceback from aspc/io/lengths.py's committed_sample_parts.
    r = CliRunner().invoke(cli, ["predict", "train", str(deep_run_log), "--kind", "lexical", "-o", str(tmp_path / "p")])
    assert "meta.json" in _one_line_error(r)
    assert not (tmp_path / "p").exists()


def test_history_from_a_run_log_with_deep_meta_json_is_one_line(deep_run_log, tmp_path):
    out = tmp_path / "plan.parquet"
    r = CliRunner().invoke(cli, ["compile", str(PROMPTS), "--history", str(deep_run_log), "-o", str(out)])
    assert "meta.json" in _one_line_error(r)
    assert not out.exists()


def test_a_deep_engine_arg_is_one_line():
    # Was: a RecursionError traceback; --trainer-arg already said so.
    with pytest.raises(ConfigError, match="nests too deeply"):
        parse_engine_args([f"max_num_seqs={DEEP}"])


def test_a_model_config_nested_deep_is_unreadable(tmp_path):
    (tmp_path / "config.json").write_text(DEEP, encoding="utf-8")
    with pytest.raises(BackendError, match="unreadable config.json"):
        check_causal_lm(tmp_path)


def test_a_stored_payload_nested_deep_is_one_line(tmp_path):
    table = pa.table({"prompt_id": pa.array(["p"]), "sample_index": pa.array([0], pa.int32()),
                      "payload": pa.array([DEEP], pa.large_string())})  # fmt: skip
    pq.write_table(table, tmp_path / PAYLOAD_FILE)
    with pytest.raises(RunError, match="cannot read the waiting samples' payloads"):
        read_payloads(tmp_path)


def test_deep_json_is_what_python_refuses():
    """The premise: DEEP is valid JSON Python's parser cannot read (else the tests above prove nothing)."""
    with pytest.raises(RecursionError):
        json.loads(DEEP)


def test_json_output_of_object_arrays_is_no_false_cycle():
    # Was: the iterative _finite keyed its cycle check by id() of lists it made from NumPy values and let them be
    # freed, so the next such list, at the same address, was taken for a cycle ("Circular reference detected").
    import numpy as np

    from aspc.cli.common import _finite

    got = _finite({"x": np.array([np.array([1.0, np.nan]), np.array([2.0])], dtype=object)})
    assert got == {"x": [[1.0, None], [2.0]]}
    loop: list = []
    loop.append(loop)
    with pytest.raises(ValueError, match="Circular reference"):
        _finite(loop)


def test_token_counts_read_a_deep_text_prompt_that_opens_like_a_chat_as_text():
    # Was: caps._messages raised RecursionError, worded as the tokenizer's chat template failing on a prompt.
    from aspc.caps import _messages

    text = '[{"role":' + "[" * 100_000
    assert _messages(text) == [{"role": "user", "content": text}]


def test_a_tokenizer_config_nested_deep_or_not_an_object_has_no_chat_template(tmp_path):
    # Was: a RecursionError traceback (deep), an AttributeError traceback ([]).
    from aspc.caps import chat_tokenizer

    for text in (DEEP, "[]"):
        (tmp_path / "tokenizer_config.json").write_text(text, encoding="utf-8")
        assert chat_tokenizer(str(tmp_path)) is None


def test_rollout_history_reads_a_deep_text_prompt_that_opens_like_a_chat_as_text():
    # Was: verl_rollouts._messages raised RecursionError (compile --history ROLLOUT_DIR with such a prompt).
    from aspc.io.verl_rollouts import _messages

    text = '[{"role":' + "[" * 100_000
    assert _messages(text) == [text]


def test_a_lexical_predictor_saved_with_one_fold_loads():
    # folds 1 is what LexicalConfig(folds=1) through the API saves (training itself takes at least 2).
    from aspc.predict.lexical import LexicalConfig

    d = LexicalConfig().to_dict()
    d["folds"] = 1
    assert LexicalConfig.from_dict(d).folds == 1
