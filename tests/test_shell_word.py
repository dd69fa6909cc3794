"""The commands aspc prints for --resume/--overwrite give the shell back the very bytes of every argument."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aspc.cli.common import shell_word

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


@settings(max_examples=150, deadline=None)
@given(st.binary(min_size=1, max_size=12).filter(lambda b: b"\0" not in b))
def test_bash_reads_back_the_bytes_of_any_argument(raw):
    arg = os.fsdecode(raw)  # as Python holds it in sys.argv: bytes that are not UTF-8 as lone surrogates
    done = subprocess.run(["bash", "-c", f"printf %s {shell_word(arg)}"], capture_output=True, timeout=30)
    assert done.returncode == 0 and done.stdout == raw


def test_a_name_that_is_not_utf8_is_quoted_as_bytes():
    # shlex.quote printed the surrogate as the text \udcff: the pasted command named another directory.
    assert shell_word(os.fsdecode(b"ckdir=/tmp/ck\xff")) == "$'ckdir=/tmp/ck\\xff'"
    assert shell_word("plain name") == "'plain name'"
