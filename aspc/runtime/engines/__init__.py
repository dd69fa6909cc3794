"""Engines: who owns the clock and the concurrency. ``local`` is :mod:`.virtual` (the sim's virtual clock) or :mod:`.threads` (wall clock); ``ray`` is :mod:`.ray`."""
