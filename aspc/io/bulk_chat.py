"""Chat prompts of a columnar table in their stored form, built with Arrow compute instead of per-row Python.

A chat is stored as compact JSON (:func:`aspc.io.rows.chat_messages`), what
``json.dumps(messages, ensure_ascii=False, separators=(",", ":"))`` writes, and
its plain text is the contents joined by a blank line. verl datasets keep their
prompts as chats (``list<struct<role, content>>`` in Parquet), and turning a
million of them into Python lists and back took most of a compile's time.
Here the same bytes come from string kernels: JSON's escapes are byte
replacements (UTF-8 never puts a byte below 0x80 inside a multi-byte
character), applied only for the bytes the column holds, then messages and
rows are joined. Anything the kernels do not cover (a content given as parts,
another non-null field such as ``name``, a null or empty chat) returns None:
the caller then reads the rows one by one, which also words any error.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from aspc.io.table import string_column

__all__ = ["chat_columns"]

# JSON escapes of the bytes json.dumps escapes with ensure_ascii=False; the backslash first,
# so the backslashes the others add are not doubled.
_ESCAPES = [(0x5C, "\\\\"), (0x22, '\\"'), (0x08, "\\b"), (0x09, "\\t"), (0x0A, "\\n"), (0x0C, "\\f"), (0x0D, "\\r")]
_ESCAPES += [(b, f"\\u{b:04x}") for b in range(0x20) if b not in (0x08, 0x09, 0x0A, 0x0C, 0x0D)]


def _scalars(*texts: str) -> list[pa.Scalar]:
    """Arrow string scalars taken from an array: a Python value handed to pyarrow imports pandas (~0.3 s) to ask
    whether it is one of its types, and a compile never needs pandas."""
    col = string_column(list(texts))
    return [col[i] for i in range(len(texts))]


def _bytes_of(arr: pa.Array) -> np.ndarray:
    """The UTF-8 bytes of ``arr``'s values (a view; string arrays with no nulls)."""
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int32)[arr.offset : arr.offset + len(arr) + 1]
    data = arr.buffers()[2]
    if data is None:
        return np.empty(0, np.uint8)
    return np.frombuffer(data, dtype=np.uint8)[int(offsets[0]) : int(offsets[-1])]


def _escaped(arr: pa.Array) -> pa.Array:
    """Each string as JSON writes it between its quotes (``ensure_ascii=False``)."""
    data = _bytes_of(arr)
    present = np.zeros(256, dtype=bool)
    present[np.unique(data[data < 0x20])] = True  # control bytes are rare: unique sorts only those
    present[0x22], present[0x5C] = bool((data == 0x22).any()), bool((data == 0x5C).any())
    for byte, escape in _ESCAPES:
        if present[byte]:
            arr = pc.replace_substring(arr, chr(byte), escape)  # options, not values: no pandas
    return arr


def chat_columns(arr: pa.Array, roles: frozenset[str]) -> tuple[pa.Array, pa.Array] | None:
    """(stored chats, plain texts) of a ``list<struct<role, content>>`` column, or None to read it row by row.

    Parameters
    ----------
    arr
        The prompt column, one list of messages per row, no null rows.
    roles
        The roles a chat message may have.

    Returns
    -------
    tuple of pyarrow.Array, or None
        String arrays equal to what the row reader builds, or None where the
        column holds anything this does not cover. Contents are not checked
        here for UTF-8 validity, blank chats or size: the caller checks the
        returned arrays as it checks text prompts.
    """
    if not (pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type)) or arr.null_count:
        return None
    item = arr.type.value_type
    if not pa.types.is_struct(item) or item.get_field_index("role") < 0 or item.get_field_index("content") < 0:
        return None
    counts = pc.list_value_length(arr)
    if len(arr) and pc.min(counts).as_py() == 0:
        return None  # an empty chat: the row reader says so
    messages = arr.flatten()
    if messages.null_count:
        return None
    # Fields besides role and content: the row reader keeps them in the stored chat unless null.
    names = [item.field(i).name for i in range(item.num_fields)]
    if any(n not in ("role", "content") and messages.field(n).null_count != len(messages) for n in names):
        return None
    role, content = messages.field("role"), messages.field("content")
    if not all(pa.types.is_string(a.type) for a in (role, content)) or role.null_count or content.null_count:
        return None
    # string_column, not pa.array (see _scalars).
    if not pc.all(pc.is_in(role, value_set=string_column(sorted(roles)))).as_py():
        return None
    if int(pc.sum(pc.binary_length(content)).as_py() or 0) * 6 + 64 * len(messages) >= 2**31:
        return None  # escapes may grow the text up to 6x: past 2 GiB a string array cannot hold it
    one = pc.binary_join_element_wise(*_scalars('{"role":"'), _escaped(role), *_scalars('","content":"'),
                                      _escaped(content), *_scalars('"}', ""))  # fmt: skip
    offsets = arr.offsets
    offsets = pc.subtract(offsets, offsets[0]) if offsets[0].as_py() else offsets  # a slice's offsets start late
    lists = pa.ListArray if pa.types.is_list(arr.type) else pa.LargeListArray
    open_, comma, close, nothing, blank_line = _scalars("[", ",", "]", "", "\n\n")
    stored = pc.binary_join_element_wise(open_, pc.binary_join(lists.from_arrays(offsets, one), comma), close, nothing)
    texts = pc.binary_join(lists.from_arrays(offsets, content), blank_line)
    return stored, texts
