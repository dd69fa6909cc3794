"""Word and whitespace characters as Hugging Face ``tokenizers`` reads them around an added token.

``single_word`` refuses a match with a word character on either side, and ``lstrip`` / ``rstrip``
take whitespace along. ``tokenizers`` (Rust) decides both with Unicode's definitions: ``\\w`` of the
``regex`` crate (Alphabetic, marks, decimal digits, connector punctuation, the joiners) and
``char::is_whitespace`` (the White_Space property). Python's ``\\w`` and ``str.isspace`` differ:
``²`` and ``½`` are word characters to Python, combining marks and ``‿`` are not, and the
information separators U+001C-U+001F are whitespace to Python alone. Code points Python's
``unicodedata`` does not know yet (assigned in a later Unicode version) are neither here.
"""

from __future__ import annotations

import unicodedata

# Symbols with the Other_Alphabetic property (circled and squared Latin letters): Alphabetic, so words.
_ALPHABETIC_SYMBOLS = ((0x24B6, 0x24E9), (0x1F130, 0x1F149), (0x1F150, 0x1F169), (0x1F170, 0x1F189))
_JOINERS = "\u200c\u200d"
_SEPARATORS = "\x1c\x1d\x1e\x1f"


def is_word_char(ch: str) -> bool:
    """Whether ``ch`` is a word character to ``tokenizers``' ``single_word`` check."""
    cat = unicodedata.category(ch)
    if cat[0] in "LM" or cat in ("Nd", "Nl", "Pc") or ch in _JOINERS:
        return True
    return cat == "So" and any(lo <= ord(ch) <= hi for lo, hi in _ALPHABETIC_SYMBOLS)


def is_white_space(ch: str) -> bool:
    """Whether ``ch`` is whitespace to ``tokenizers``' ``lstrip`` / ``rstrip`` (Rust's ``char::is_whitespace``)."""
    return ch.isspace() and ch not in _SEPARATORS


def skip_white_space(s: str, at: int) -> int:
    """The first index from ``at`` of ``s`` that is not :func:`is_white_space`."""
    while at < len(s) and is_white_space(s[at]):
        at += 1
    return at
