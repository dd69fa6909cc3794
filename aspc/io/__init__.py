"""Dataset input: prompts (JSONL, JSON, CSV, Parquet incl. verl chat), lengths and token counts."""

from aspc.io.lengths import read_lengths
from aspc.io.prompts import content_id, read_prompts
from aspc.io.ragged import RaggedLengths
from aspc.io.table import PromptTable, SkippedRow

__all__ = ["PromptTable", "RaggedLengths", "SkippedRow", "content_id", "read_lengths", "read_prompts"]
