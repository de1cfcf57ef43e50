"""Summarise a mutmut run per file: mutants, killed, survived, score.

    python scripts/mutation_report.py [--survivors FILE] [--equivalent docs/mutation/equivalent.md]

Reads `mutmut results --all true` (run from the project root after `mutmut
run`). With `--survivors` it also writes the diff of every surviving mutant to
FILE. With `--equivalent` it reads the mutant names listed there (one per
table row, in backquotes) and reports how many survivors are NOT listed: the
goal is none. Exit status 1 when such a survivor exists.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

MUTMUT = [sys.executable, "-m", "mutmut"]
LINE = re.compile(r"^\s*(?P<name>\S+__mutmut_\d+): (?P<status>.+)$")


def module_file(name: str) -> str:
    """`master.role_tree.xǁRoleTreeǁ_walk__mutmut_3` -> `master/role_tree.py`."""
    module = name.split(".x", 1)[0].replace(".", "/")
    return f"{module}/__init__.py" if Path(module).is_dir() else f"{module}.py"


def results() -> dict[str, str]:
    out = subprocess.run(
        [*MUTMUT, "results", "--all", "true"], capture_output=True, text=True, check=True
    ).stdout
    found = {}
    for line in out.splitlines():
        match = LINE.match(line)
        if match:
            found[match["name"]] = match["status"].strip()
    return found


def equivalents(path: Path) -> set[str]:
    if not path.exists():
        return set()
    return set(re.findall(r"`([^`\s]+__mutmut_\d+)`", path.read_text()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--survivors", type=Path, help="write each survivor's diff here")
    parser.add_argument("--equivalent", type=Path, help="the reviewed equivalent mutants")
    args = parser.parse_args()

    found = results()
    if not found:
        print("no mutmut results: run `mutmut run` first", file=sys.stderr)
        return 2
    known = equivalents(args.equivalent) if args.equivalent else set()
    by_file: dict[str, Counter[str]] = defaultdict(Counter)
    open_survivors = []
    for name, status in found.items():
        counts = by_file[module_file(name)]
        counts[status] += 1
        if status == "survived" and name in known:
            counts["equivalent"] += 1
        elif status != "killed":
            open_survivors.append(name)

    print(
        f"{'file':32} {'mutants':>7} {'killed':>6} {'survived':>8} {'no tests':>8} "
        f"{'other':>5} {'equiv.':>6} {'score':>7} {'score*':>7}"
    )
    totals: Counter[str] = Counter()
    for path in sorted(by_file):
        c = by_file[path]
        n = sum(v for k, v in c.items() if k != "equivalent")
        other = n - c["killed"] - c["survived"] - c["no tests"]
        row = (n, c["killed"], c["survived"], c["no tests"], other, c["equivalent"])
        totals.update(
            dict(zip(("n", "killed", "survived", "no tests", "other", "equiv"), row, strict=True))
        )
        print(
            f"{path:32} {row[0]:7} {row[1]:6} {row[2]:8} {row[3]:8} {row[4]:5} {row[5]:6} "
            f"{c['killed'] / n:7.1%} {c['killed'] / max(1, n - c['equivalent']):7.1%}"
        )
    n = totals["n"]
    print(
        f"{'all':32} {n:7} {totals['killed']:6} {totals['survived']:8} "
        f"{totals['no tests']:8} {totals['other']:5} {totals['equiv']:6} "
        f"{totals['killed'] / n:7.1%} {totals['killed'] / max(1, n - totals['equiv']):7.1%}"
    )
    print("score: killed / mutants; score*: killed / (mutants - reviewed equivalent ones)")
    if args.equivalent:
        print(f"survivors not killed and not listed as equivalent: {len(open_survivors)}")
        for name in sorted(open_survivors):
            print(f"  {name}: {found[name]}")
    if args.survivors:
        diffs = []
        for name in sorted(n for n, s in found.items() if s != "killed"):
            shown = subprocess.run([*MUTMUT, "show", name], capture_output=True, text=True)
            diffs.append(f"## {name} ({found[name]})\n{shown.stdout.strip()}\n")
        args.survivors.write_text("\n".join(diffs))
    return 1 if args.equivalent and open_survivors else 0


if __name__ == "__main__":
    sys.exit(main())
