"""Helpers for tests: fakes for the master core's effects (`fakes`), a harness that drives
it (`core`), and hand-made cluster snapshots for the views that read them (`snapshots`)."""
