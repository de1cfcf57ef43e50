"""Run the fault-injection scenario (tests/chaos.py) over many seeds and print the figures.

    python scripts/fault_injection.py --runs 50            # seeds 0..49
    python scripts/fault_injection.py --seeds 7 12 --faults 10

A benchmark-style script: it prints one line per run and a total, and exits 1
if any run had a violation (each is printed).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mesolite.logs import configure
from tests.chaos import run_chaos


async def main_async(seeds: list[int], faults: int, keep: Path | None) -> int:
    totals: Counter[str] = Counter()
    tasks = violations = 0
    for seed in seeds:
        with tempfile.TemporaryDirectory(prefix=f"chaos-{seed}-", dir=keep) as tmp:
            report = await run_chaos(Path(tmp), seed, faults)
        print(report.line(), flush=True)
        for v in report.violations:
            print(f"    violation: {v}", flush=True)
        totals.update(report.faults)
        tasks += report.tasks
        violations += len(report.violations)
    kills = ", ".join(f"{n} {k}" for k, n in sorted(totals.items()))
    print(
        f"\n{len(seeds)} runs, {sum(totals.values())} kills ({kills}), {tasks} tasks, "
        f"{violations} violations"
    )
    return 1 if violations else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--seeds", type=int, nargs="*")
    parser.add_argument("--faults", type=int, default=6, help="faults injected per run")
    args = parser.parse_args()
    configure(level="error")
    seeds = args.seeds if args.seeds else list(range(args.runs))
    return asyncio.run(main_async(seeds, args.faults, None))


if __name__ == "__main__":
    sys.exit(main())
