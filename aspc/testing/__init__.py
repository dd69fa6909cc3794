"""Fixtures for tests, benchmarks and examples, kept out of the library proper.

:mod:`aspc.testing.plans` builds plan tables without the compiler;
:mod:`aspc.testing.tiny_model` writes a tiny random causal LM offline. Nothing
in ``aspc`` outside this package imports it.
"""
