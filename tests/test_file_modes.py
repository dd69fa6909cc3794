"""The umask read without setting it, and the fallback where /proc says nothing."""

from __future__ import annotations

import os

from aspc import file_modes


def test_the_umask_is_read_as_it_is_with_and_without_proc(monkeypatch):
    was = os.umask(0o027)
    try:
        assert file_modes.current_umask() == 0o027

        def no_proc(*a, **k):
            raise OSError("no /proc")

        monkeypatch.setattr(file_modes, "open", no_proc, raising=False)
        assert file_modes.current_umask() == 0o027
        assert os.umask(0o027) == 0o027  # the fallback put it back
    finally:
        os.umask(was)
