"""Dataset input: prompts (JSONL, JSON, CSV, Parquet incl. verl chat) and lengths."""

from aspc.io.lengths import read_lengths
from aspc.io.prompts import PromptTable, SkippedRow, content_id, read_prompts

__all__ = ["PromptTable", "SkippedRow", "content_id", "read_lengths", "read_prompts"]
