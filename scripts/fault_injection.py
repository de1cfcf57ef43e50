"""Run the fault-injection scenario (tests/chaos.py) over many seeds and print the figures.

    python scripts/fault_injection.py --runs 50            # seeds 0..49
    python scripts/fault_injection.py --seeds 7 12 --faults 10
    python scripts/fault_injection.py --runs 1000 --out runs.jsonl --shard 0/2 &
    python scripts/fault_injection.py --runs 1000 --out runs.jsonl --shard 1/2 &
    python scripts/fault_injection.py --summary runs.jsonl
    python scripts/fault_injection.py --seeds 207 --keep-failed failed/   # logs of a failure
    python scripts/fault_injection.py --ha --runs 100 --out ha-runs.jsonl   # tests/chaos_ha.py

With `--ha` the cluster has three masters on a 3-member etcd cluster, and the faults
include leader kills, leader stops (SIGSTOP past the lease) and etcd member kills; the
totals add the takeovers and their time, p50 and p99.

A benchmark-style script: it prints one line per run and the totals, and exits
1 if any run had a violation (each is printed). With `--out`, each run's
figures are appended to a JSON-lines file as it ends, and seeds already in the
file are skipped, so a long batch can be stopped and resumed (across sessions)
and split over processes with `--shard K/N` (seeds with seed % N == K).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mesolite.logs import configure
from tests.chaos import Report, run_chaos
from tests.chaos_ha import run_ha_chaos
from tests.support.cgroups import TEST_CGROUPS_ROOT, remove_tree

FIGURES = (
    "silently_lost",
    "lost_with_agent_up",
    "duplicate_updates",
    "leaked",
    "orphans",
    "orphans_of_gone",
    "invariant_violations",
)


def summarize(runs: list[dict[str, Any]]) -> str:
    faults: Counter[str] = Counter()
    ended: Counter[str] = Counter()
    figures: Counter[str] = Counter()
    for run in runs:
        faults.update(run["faults"])
        ended.update(run["ended"])
        figures.update({k: run[k] for k in FIGURES})
    kills = ", ".join(f"{n} {k}" for k, n in sorted(faults.items()))
    ends = ", ".join(f"{n} {k}" for k, n in sorted(ended.items()))
    bad = sum(1 for run in runs if run["violations"])
    lines = [
        f"{len(runs)} runs (seeds {min(r['seed'] for r in runs)}..{max(r['seed'] for r in runs)})"
        if runs
        else "0 runs",
        f"kills: {sum(faults.values())} ({kills})",
        f"tasks: {sum(r['tasks'] for r in runs)} ({ends})",
        *(f"{k.replace('_', ' ')}: {figures[k]}" for k in FIGURES),
        f"runs with any violation: {bad}",
    ]
    takeovers = sorted(t for run in runs for t in run.get("takeovers", []))
    if takeovers:
        changes = sum(run.get("etcd_member_leader_changes", 0) for run in runs)
        lines.append(
            f"takeovers: {len(takeovers)}, p50 {_quantile(takeovers, 0.5):.2f} s, "
            f"p99 {_quantile(takeovers, 0.99):.2f} s, max {takeovers[-1]:.2f} s; "
            f"leader changes on an etcd member's kill: {changes}"
        )
    return "\n".join(lines)


def _quantile(values: list[float], q: float) -> float:
    """The nearest-rank quantile of sorted `values`."""
    return values[min(len(values) - 1, max(0, round(q * len(values) + 0.5) - 1))]


def load(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


async def main_async(
    seeds: list[int], faults: int, out: Path | None, keep_failed: Path | None, ha: bool = False
) -> int:
    runs: list[dict[str, Any]] = []
    for seed in seeds:
        with tempfile.TemporaryDirectory(prefix=f"chaos-{seed}-") as tmp:
            run = run_ha_chaos if ha else run_chaos
            try:
                report = await run(Path(tmp), seed, faults)
            except Exception as e:  # the harness itself failed: a finding too, logs kept
                report = Report(seed)
                report.violations.append(f"the run failed: {e!r}")
            if report.violations and keep_failed is not None:
                # The logs of every process of the run, to find out why.
                # (Sockets, such as the agents' supervisors', cannot be copied.)
                with contextlib.suppress(shutil.Error):
                    shutil.copytree(tmp, keep_failed / f"seed-{seed}", dirs_exist_ok=True)
        print(report.line(), flush=True)
        for v in report.violations:
            print(f"    violation: {v}", flush=True)
        record = report.to_json()
        if out is not None:
            with out.open("a") as f:
                f.write(record + "\n")
        runs.append(json.loads(record))
    print()
    print(summarize(runs))
    return 1 if any(run["violations"] for run in runs) else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--seeds", type=int, nargs="*")
    parser.add_argument("--faults", type=int, default=6, help="faults injected per run")
    parser.add_argument("--out", type=Path, help="append each run's figures (JSON lines)")
    parser.add_argument("--shard", default="0/1", help="K/N: only seeds with seed %% N == K")
    parser.add_argument(
        "--ha", action="store_true", help="three masters on etcd (tests/chaos_ha.py)"
    )
    parser.add_argument("--summary", type=Path, help="print the totals of a --out file and exit")
    parser.add_argument(
        "--keep-failed",
        type=Path,
        help="copy the work dir (all logs) of a run with violations here",
    )
    args = parser.parse_args()
    if args.summary:
        print(summarize(load(args.summary)))
        return 0
    configure(level="error")
    k, n = (int(x) for x in args.shard.split("/"))
    seeds = args.seeds if args.seeds else list(range(args.runs))
    done = {run["seed"] for run in load(args.out)} if args.out else set()
    seeds = [s for s in seeds if s % n == k and s not in done]
    try:
        return asyncio.run(main_async(seeds, args.faults, args.out, args.keep_failed, ha=args.ha))
    finally:
        remove_tree(TEST_CGROUPS_ROOT)  # the agents' task cgroups, as the test session does


if __name__ == "__main__":
    sys.exit(main())
