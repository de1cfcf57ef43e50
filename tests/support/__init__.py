"""Helpers for tests: fakes for the master core's effects (`fakes`), a harness that drives
it (`core`), and hand-made cluster snapshots for the views that read them (`snapshots`).

The fuzz tests (tests/test_fuzz_*.py, docs/fuzz.md) add: hypothesis strategies for every
message a client sends (`wire_strategies`) and every HTTP request (`http_strategies`);
the servicers driven in-process (`servicer_streams`) and raw client streams over gRPC
(`wire_streams`); one session played on either (`fuzz_session`); well-formed calls for
set-ups and probes (`calls`); and what every layer checks and reports (`fuzzing`).
Throwaway Unix accounts for tests of frameworks' users: `accounts`."""
