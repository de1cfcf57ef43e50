"""Shares of one process's samples by area: the agent's task work, from a profile of
`scripts/bench_task_starts.py runner`.

    py-spy record --gil -f raw -o gil.txt -- python scripts/bench_task_starts.py runner
    python scripts/profile_shares.py gil gil.txt

    perf record -F 999 -g -e cpu-clock -o run.perf -- \\
        sh -c 'echo $$ > pid; exec python scripts/bench_task_starts.py runner'
    perf script -i run.perf -F pid,tid,ip,sym,dso > run.script
    python scripts/profile_shares.py kernel run.script --pid "$(cat pid)"

``gil``: py-spy's raw stacks (samples of the thread holding the GIL), each counted
under the first area whose functions it holds (`AREAS`, in order), else "other".
``kernel``: perf's samples of process `--pid` (all its threads), by the system call
they are in and the filesystem it works on (ext4 for the sandboxes and records,
cgroupfs for the cgroups), or "user" (the interpreter itself).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

AREAS = (
    (
        "checkpoints and records written",
        ("write_json_atomically", "write_checkpoint", "write_json_whole", "TaskLog"),
    ),
    (
        "end of a run (cgroup killed, read, removed)",
        ("_end_of", "clean_up", "kill_cgroup", "_end_container"),
    ),
    (
        "set-up (sandbox, records, cgroup and its limits)",
        ("_set_up", "prepare_records", "prepare_sandbox", "Isolator.create"),
    ),
    ("the supervisor's socket and frames", ("_supervisor_client", "SupervisorClient")),
    ("the task's environment", ("task_environment",)),
    ("imports", ("_find_and_load",)),
)
_SYSCALL = re.compile(r"^(?:__x64_sys_|__do_sys_)(\w+)")


def gil_shares(text: str) -> Counter[str]:
    counts: Counter[str] = Counter()
    for line in text.splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        area = next((a for a, keys in AREAS if any(k in stack for k in keys)), "other")
        counts[area] += int(n)
    return counts


def kernel_shares(text: str, pid: str) -> Counter[str]:
    counts: Counter[str] = Counter()
    frames: list[str] = []
    owner = None

    def flush() -> None:
        if owner != pid or not frames:
            return
        names = [f.split(" ", 1)[1].split(" (")[0] if " " in f else f for f in frames]
        call = next((m.group(1) for n in names if (m := _SYSCALL.match(n))), None)
        if call is None:
            kernel = "kernel.kallsyms" in frames[0]
            counts["kernel, outside a system call" if kernel else "user"] += 1
            return
        joined = " ".join(names)
        # ext4 first: its stacks may charge pages to a memory cgroup (mem_cgroup_*).
        where = (
            "ext4"
            if "ext4" in joined or "jbd2" in joined
            else "cgroupfs"
            if "kernfs" in joined or "cgroup" in joined
            else ""
        )
        counts[f"{call} ({where})" if where else call] += 1

    for line in text.splitlines():
        if m := re.match(r"\s*(\d+)/(\d+)\s", line):
            flush()
            owner, frames = m.group(1), []
        elif line.strip():
            frames.append(line.strip())
    flush()
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=("gil", "kernel"))
    parser.add_argument("file", type=Path)
    parser.add_argument("--pid", help="kernel: the process whose samples count")
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    text = args.file.read_text(errors="replace")
    if args.kind == "kernel" and not args.pid:
        parser.error("kernel needs --pid")
    counts = gil_shares(text) if args.kind == "gil" else kernel_shares(text, args.pid)
    total = sum(counts.values())
    print(f"{total} samples")
    for area, n in counts.most_common(args.top):
        print(f"{100 * n / total:5.1f}%  {area}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
