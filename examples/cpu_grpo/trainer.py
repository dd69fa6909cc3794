"""The example's trainer factory and its verifiable toy reward.

``aspc run ... --trainer examples.cpu_grpo.trainer:make_trainer`` imports this
module (run from the repository root) and calls :func:`make_trainer` with the
run's context. The reward is checked by a program, not a model: a prompt
``"<id> repeat <c>:"`` asks for the character ``c``; the reward is the share
of the first :data:`TARGET_LEN` response characters that are ``c``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from aspc.runtime.trainers.grpo import GRPOConfig, GRPOTrainer

TARGET_LEN = 8  # characters the reward looks at
LETTERS = "abcd"  # the characters prompts ask for


def target_char(prompt: str) -> str:
    """The character a prompt asks for: the one just before its trailing colon."""
    return prompt.rstrip().rstrip(":")[-1:]


def reward(prompt: str, response: str) -> float:
    """Share of the first TARGET_LEN response characters equal to the prompt's character (0..1)."""
    c = target_char(prompt)
    return sum(ch == c for ch in response[:TARGET_LEN]) / TARGET_LEN


class LoggingGRPOTrainer(GRPOTrainer):
    """GRPOTrainer that also appends one JSON line per step to ``stats`` (if given)."""

    def __init__(self, *args: Any, stats: str | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.stats = Path(stats) if stats else None
        # Started by the first step (a new file) or by restore(); a resume that is refused, or that
        # finds its log complete, leaves the file as it was.
        self._stats_started = False

    def step(self, batch: Any) -> Any:
        result = super().step(batch)
        if self.stats is not None:
            self.stats.parent.mkdir(parents=True, exist_ok=True)
            with open(self.stats, "a" if self._stats_started else "w", encoding="utf-8") as fh:
                fh.write(json.dumps(self.history[-1].__dict__) + "\n")
            self._stats_started = True
        return result

    def restore(self, version: int) -> Any:
        weights = super().restore(version)
        if self.stats is not None:  # the steps the resumed run holds, as the checkpoint recorded them
            self.stats.parent.mkdir(parents=True, exist_ok=True)
            self.stats.write_text("".join(json.dumps(h.__dict__) + "\n" for h in self.history))
            self._stats_started = True
        return weights


def make_trainer(context: Any, lr: float = 3e-3, seed: int = 0, stats: str | None = None,
                 checkpoint_dir: str | None = None, checkpoint_every: int = 1) -> LoggingGRPOTrainer:
    """``--trainer`` factory: a GRPO trainer on the run's ``--model`` with the toy reward.

    Parameters
    ----------
    context
        The run's BackendContext; ``context.options["model"]`` is the
        resolved model directory.
    lr, seed
        Optimiser learning rate and torch seed (``--trainer-arg lr=0.003``).
    stats
        Optional JSONL path for per-step reward and loss (``--trainer-arg stats=out/stats.jsonl``).
    checkpoint_dir
        Optional directory for a checkpoint after every step, so that ``aspc run
        --resume`` trains on from the last logged step (``--trainer-arg
        checkpoint_dir=out/ckpt``).
    checkpoint_every
        Steps between checkpoints (``--trainer-arg checkpoint_every=10``); a
        resume restores the newest and takes the logged steps after it again.
    """
    model = context.options.get("model")
    if not model:
        raise ValueError("pass --model DIR: the trainer trains the same model the workers generate with")
    return LoggingGRPOTrainer(model, reward, GRPOConfig(lr=lr, seed=seed), device="cpu", stats=stats,
                              checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every)
