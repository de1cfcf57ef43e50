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
# A mutant whose tests ran past mutmut's time limit (an endless loop, say) is
# caught too; the table counts it apart ("other").
CAUGHT = ("killed", "timeout")
LINE = re.compile(r"^\s*(?P<name>\S+__mutmut_\d+): (?P<status>.+)$")


def module_file(name: str) -> str:
    """`mesolite.master.role_tree.xǁRoleTreeǁ_walk__mutmut_3` -> `mesolite/master/role_tree.py`."""
    module = name.split(".x", 1)[0].replace(".", "/")
    return f"{module}/__init__.py" if Path(module).is_dir() else f"{module}.py"


def caught(counts: Counter[str]) -> int:
    return sum(counts[status] for status in CAUGHT)


def _row(row: tuple[int, ...], caught: int, equivalent: int) -> str:
    n, killed, survived, no_tests, other, equiv = row
    return (
        f"{n:7} {killed:6} {survived:8} {no_tests:8} {other:5} {equiv:6} "
        f"{caught / n:7.1%} {caught / max(1, n - equivalent):7.1%}"
    )


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
        elif status not in CAUGHT:
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
            dict(
                zip(
                    ("n", "killed", "survived", "no tests", "other", "equivalent"), row, strict=True
                )
            )
        )
        totals["timeout"] += c["timeout"]
        print(f"{path:32} " + _row(row, caught(c), c["equivalent"]))
    n = totals["n"]
    everything = tuple(totals[k] for k in ("n", "killed", "survived", "no tests", "other"))
    equivalent = totals["equivalent"]
    print(f"{'all':32} " + _row((*everything, equivalent), caught(totals), equivalent))
    print(
        "score: caught (killed, or timed out) / mutants; "
        "score*: caught / (mutants - reviewed equivalent ones)"
    )
    timeouts = sorted(name for name, status in found.items() if status == "timeout")
    if timeouts:
        print(f"timed out (counted as caught): {', '.join(timeouts)}")
    if args.equivalent:
        print(f"survivors not killed and not listed as equivalent: {len(open_survivors)}")
        for name in sorted(open_survivors):
            print(f"  {name}: {found[name]}")
    if args.survivors:
        diffs = []
        for name in sorted(n for n, s in found.items() if s not in CAUGHT):
            shown = subprocess.run([*MUTMUT, "show", name], capture_output=True, text=True)
            diffs.append(f"## {name} ({found[name]})\n{shown.stdout.strip()}\n")
        args.survivors.write_text("\n".join(diffs))
    return 1 if args.equivalent and open_survivors else 0


if __name__ == "__main__":
    sys.exit(main())
