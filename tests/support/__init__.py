"""Helpers for tests: fakes for the master core's effects, and a harness that drives it."""
