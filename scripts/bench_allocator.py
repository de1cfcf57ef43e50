"""Time one allocation cycle on Mesos' allocator benchmark grid, and fair shares at scale.

    python scripts/bench_allocator.py                 # the whole grid (a few minutes)
    python scripts/bench_allocator.py --quick         # a smaller grid
    python scripts/bench_allocator.py --max-filters 40000000   # declined case everywhere

Agents are `cpus:24;mem:4096;disk:4096`, as in Mesos' HierarchicalAllocator
benchmarks. "offer all" times the first cycle, in which every agent's free
resources are offered. "declined" times a cycle after every framework has
declined every agent with a long filter (set up through the allocator's own
grant/recover path, one (framework, agent) pair at a time); it needs one
filter per pair, so by default it runs only where frameworks x agents is at
most --max-filters. A benchmark, not a test: it prints figures and asserts nothing.

Two more columns concern declared demands (`Allocator.set_demand`). "unfit" times a
cycle, after a first one, in which every framework declared a shape no agent can
hold (`cpus:48`): each is passed over at each agent by the first cycle, which then
counts it toward the agent's block, so the next cycle skips every agent in O(1),
as for filters. "packing" times the first cycle with `packing=True` when every
framework waits for 20 tasks of `cpus:1;mem:128`: one grant per task, each placed
where it fits best (see the allocator's module for the cost).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mesolite.master.allocator import Allocator
from mesolite.resources import Resources

AGENT = Resources.parse("cpus:24;mem:4096;disk:4096")


UNFIT = Resources.parse("cpus:48")
TASK = Resources.parse("cpus:1;mem:128")
TASKS_EACH = 20


def build(agents: int, frameworks: int, packing: bool = False) -> Allocator:
    allocator = Allocator(lambda: 0.0, seed=1, packing=packing)
    for i in range(agents):
        allocator.add_agent(f"agent-{i}", AGENT)
    for j in range(frameworks):
        allocator.add_framework(f"framework-{j}", "*")
    return allocator


def timed(action: Callable[[], object], repeat: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeat):
        gc.collect()
        start = time.perf_counter()
        result = action()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def offer_all(agents: int, frameworks: int, repeat: int) -> tuple[float, int]:
    return first_cycles(build(agents, frameworks), repeat)


def first_cycles(allocator: Allocator, repeat: int) -> tuple[float, int]:
    """The first cycle, `repeat` times: everything offered is given back in between."""
    times, offers = [], 0
    for _ in range(repeat):
        gc.collect()
        start = time.perf_counter()
        decisions = allocator.allocate()
        times.append(time.perf_counter() - start)
        offers = len(decisions)
        for d in decisions:  # give everything back, unfiltered, for the next repetition
            allocator.recover(d.framework_id, d.agent_id, d.resources)
    return statistics.median(times), offers


def declined(agents: int, frameworks: int, repeat: int) -> tuple[float, int]:
    allocator = build(agents, frameworks)
    framework_ids = [f"framework-{j}" for j in range(frameworks)]
    for i in range(agents):
        agent_id = f"agent-{i}"
        for framework_id in framework_ids:
            allocator.grant(framework_id, agent_id, AGENT)
            allocator.recover(framework_id, agent_id, AGENT, refuse_seconds=3600)
    seconds, decisions = timed(allocator.allocate, repeat)
    assert isinstance(decisions, list)
    return seconds, len(decisions)


def unfit(agents: int, frameworks: int, repeat: int) -> tuple[float, int]:
    allocator = build(agents, frameworks)
    for j in range(frameworks):
        allocator.set_demand(f"framework-{j}", [(UNFIT, 1)])
    allocator.allocate()  # walks every framework at every agent, once
    seconds, decisions = timed(allocator.allocate, repeat)
    assert isinstance(decisions, list)
    return seconds, len(decisions)


def packing(agents: int, frameworks: int, repeat: int) -> tuple[float, int]:
    allocator = build(agents, frameworks, packing=True)
    for j in range(frameworks):
        allocator.set_demand(f"framework-{j}", [(TASK, TASKS_EACH)])
    return first_cycles(allocator, repeat)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="1k and 10k agents, 100 and 1k frameworks"
    )
    parser.add_argument("--repeat", type=int, default=3, help="cycles timed per cell (median)")
    parser.add_argument("--max-filters", type=int, default=2_000_000)
    parser.add_argument("--only", metavar="AGENTSxFRAMEWORKS", help="one cell, e.g. 10000x1000")
    args = parser.parse_args()
    agent_counts = [1_000, 10_000] if args.quick else [1_000, 10_000, 20_000]
    framework_counts = [100, 1_000] if args.quick else [100, 1_000, 2_000]
    if args.only:
        agents_text, _, frameworks_text = args.only.partition("x")
        agent_counts, framework_counts = [int(agents_text)], [int(frameworks_text)]

    print(f"python {sys.version.split()[0]}, one allocation cycle, median of {args.repeat}")
    print(
        f"{'agents':>7} {'frameworks':>10} {'offer all':>10} {'offers':>7} "
        f"{'declined':>9} {'offers':>7} {'unfit':>8} {'offers':>7} {'packing':>8} {'offers':>7}"
    )
    for agents in agent_counts:
        for frameworks in framework_counts:
            seconds, offers = offer_all(agents, frameworks, args.repeat)
            row = f"{agents:>7} {frameworks:>10} {seconds:>9.3f}s {offers:>7}"
            if agents * frameworks <= args.max_filters:
                d_seconds, d_offers = declined(agents, frameworks, args.repeat)
                row += f" {d_seconds:>8.3f}s {d_offers:>7}"
            else:
                row += f" {'(skipped: ' + format(agents * frameworks, ',') + ' filters)':>17}"
            u_seconds, u_offers = unfit(agents, frameworks, args.repeat)
            p_seconds, p_offers = packing(agents, frameworks, args.repeat)
            row += f" {u_seconds:>7.3f}s {u_offers:>7} {p_seconds:>7.3f}s {p_offers:>7}"
            print(row, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
