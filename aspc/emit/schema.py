"""The plan schema: the contract between ``aspc compile`` and ``aspc run``.

Column names, their Arrow types, the metadata keys and the schema version live
here and nowhere else. A plan has one row per prompt, written in dispatch
order: ``dispatch_rank`` equals the row number, minibatches are numbered
0..M-1 in the order they are dispatched, groups 0..G-1 likewise.
"""

from __future__ import annotations

import pyarrow as pa

# Major.minor. A reader accepts any minor of its own major and refuses a newer
# major (columns changed meaning); an older major is refused too, with a hint.
SCHEMA_VERSION = "1.0"
SCHEMA_MAJOR = 1

PROMPT_ID = "prompt_id"  # stable id: the input's id field, else a content hash
SOURCE_ROW = "source_row"  # 0-based row (line) number in the input file
PROMPT = "prompt"  # prompt text, or chat messages as JSON, so the plan is self-contained
PROMPT_TOKENS = "prompt_tokens"  # prompt length in tokens (field, else estimate)
N_SAMPLES = "n_samples"  # responses to generate for this prompt (GRPO n)
PREDICTED_LEN = "predicted_len"  # predicted mean response length, tokens
PREDICTED_Q10 = "predicted_q10"  # 10th percentile of the response length, tokens
PREDICTED_Q50 = "predicted_q50"  # median response length, tokens
PREDICTED_Q90 = "predicted_q90"  # 90th percentile of the response length, tokens
MINIBATCH = "minibatch"  # generation minibatch, numbered in dispatch order
GROUP = "group"  # dispatch group, numbered in dispatch order
DISPATCH_RANK = "dispatch_rank"  # 0-based position in dispatch order == row number
# A rolling scout's plan (aspc.rolling_scout) holds, beside each prompt's row, a scout row whose
# prompt id is the prompt's followed by this reserved suffix (a NUL byte: never in a real id). Its one
# response is held by the runtime; readers of run logs leave those rows out (cut ones are truncated).
SCOUT_ID_SUFFIX = "\x00scout"


def prompt_of(prompt_id: str) -> str:
    """The prompt a plan row generates for: its own id, or a scout row's prompt (its group's id)."""
    return prompt_id.removesuffix(SCOUT_ID_SUFFIX)


PLAN_SCHEMA = pa.schema(
    [
        pa.field(PROMPT_ID, pa.string(), nullable=False),
        pa.field(SOURCE_ROW, pa.int64(), nullable=False),
        pa.field(PROMPT, pa.string(), nullable=False),
        pa.field(PROMPT_TOKENS, pa.int64(), nullable=False),
        pa.field(N_SAMPLES, pa.int32(), nullable=False),
        pa.field(PREDICTED_LEN, pa.float64(), nullable=False),
        pa.field(PREDICTED_Q10, pa.float64(), nullable=False),
        pa.field(PREDICTED_Q50, pa.float64(), nullable=False),
        pa.field(PREDICTED_Q90, pa.float64(), nullable=False),
        pa.field(MINIBATCH, pa.int32(), nullable=False),
        pa.field(GROUP, pa.int32(), nullable=False),
        pa.field(DISPATCH_RANK, pa.int64(), nullable=False),
    ]
)

# File metadata keys (values are UTF-8 JSON unless noted).
META_SCHEMA_VERSION = b"aspc.schema_version"  # plain string, e.g. "1.0"
META_ASPC_VERSION = b"aspc.version"  # plain string: the aspc that wrote the file
META_CONFIG = b"aspc.config"  # the full compile configuration
META_PREDICTOR = b"aspc.predictor"  # predictor identity: kind, version, content hash
META_INPUT_HASH = b"aspc.input_hash"  # plain string: sha256 of the input file's bytes
META_METRICS = b"aspc.metrics"  # plan metrics (names in aspc.emit.metrics)
META_ROWS_HASH = b"aspc.rows_hash"  # plain string: sha256 over the plan rows, detects edits
# The tokenizer that counted prompt_tokens (kind, name, content hash). Written
# only when one did (compile --tokenizer); absent = estimated from UTF-8 bytes.
META_PROMPT_TOKENS = b"aspc.prompt_tokens"

PLAN_METADATA_KEYS = (
    META_SCHEMA_VERSION,
    META_ASPC_VERSION,
    META_CONFIG,
    META_PREDICTOR,
    META_INPUT_HASH,
    META_METRICS,
    META_ROWS_HASH,
    META_PROMPT_TOKENS,
)
