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


def test_transformers_logging_is_put_back_after_overlapping_calls_in_two_threads():
    """Reviewer: each call saved and restored the global setting, so two threads overlapping left ERROR for good
    (the second saved the first's ERROR) or put the host's level back in the middle of the other's call."""
    import threading

    import pytest

    tl = pytest.importorskip("transformers.utils.logging")
    from aspc.predict.transformer import quiet_transformers

    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen = []

    @quiet_transformers
    def first():  # enters first, leaves while the second still runs
        first_in.set()
        second_in.wait(10)

    @quiet_transformers
    def second():
        first_in.wait(10)
        second_in.set()
        first_out.wait(10)
        seen.append(tl.get_verbosity())  # still quiet: its own call has not ended

    tl.set_verbosity_warning()
    try:
        threads = [threading.Thread(target=first), threading.Thread(target=second)]
        for t in threads:
            t.start()
        threads[0].join(10)
        first_out.set()
        threads[1].join(10)
        assert seen == [tl.ERROR] and tl.get_verbosity() == tl.WARNING, (seen, tl.get_verbosity())
    finally:
        tl.set_verbosity_warning()
