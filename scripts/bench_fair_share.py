"""Time `compute_fair_shares` on large role trees and print a table.

    .venv/bin/python scripts/bench_fair_share.py [--repeat N]

Each case has 4 resource types. "bounded" cases give a third of the roles a
guarantee and a third a limit, with weights drawn from a few values, so the
breakpoint sweep does real work; "plain" cases have equal weights and no bounds
(the common configuration: most roles are created on first use). Times are the
best of N runs of the computation alone; building the inputs (paths and
`ShareInput`s, which a caller can keep until the configuration or the cluster
total changes) is timed once and shown separately.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable, Collection
from functools import partial

from mesolite.master.fair_share import ShareInput, compute_fair_shares
from mesolite.resources import Resources

TOTAL = Resources(cpus=100_000, mem=400_000_000, disk=1_000_000_000, gpus=2_000)
WEIGHTS = (0.5, 1.0, 1.0, 2.0, 3.7)


def _input(rng: random.Random, bounded: bool) -> ShareInput:
    if not bounded:
        return ShareInput()
    kind = rng.randrange(3)
    weight = rng.choice(WEIGHTS)
    if kind == 0:
        return ShareInput(
            weight, guarantee=Resources(cpus=rng.uniform(0, 2), mem=rng.uniform(0, 8000))
        )
    if kind == 1:
        return ShareInput(weight, limit={"cpus": rng.uniform(0, 3), "gpus": rng.choice((0, 1, 2))})
    return ShareInput(weight)


def flat(n: int, bounded: bool, seed: int = 1) -> dict[str, ShareInput]:
    rng = random.Random(seed)
    return {f"r{i:06d}": _input(rng, bounded) for i in range(n)}


def tree(parents: int, children: int, bounded: bool, seed: int = 1) -> dict[str, ShareInput]:
    rng = random.Random(seed)
    roles: dict[str, ShareInput] = {}
    for p in range(parents):
        roles[f"p{p:04d}"] = ShareInput(rng.choice(WEIGHTS)) if bounded else ShareInput()
        for c in range(children):
            roles[f"p{p:04d}/c{c:05d}"] = _input(rng, bounded)
    return roles


def deep(fanout: int, depth: int) -> dict[str, ShareInput]:
    paths = [""]
    for _ in range(depth):
        paths = [f"{p}/n{i}" if p else f"n{i}" for p in paths for i in range(fanout)]
    return dict.fromkeys(paths, ShareInput())


def best_of(repeat: int, run: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    cases: list[tuple[str, Callable[[], dict[str, ShareInput]], bool]] = [
        ("flat 1k, bounded", lambda: flat(1_000, True), False),
        ("flat 100k, plain", lambda: flat(100_000, False), False),
        ("flat 100k, bounded", lambda: flat(100_000, True), False),
        ("flat 100k, bounded, half active", lambda: flat(100_000, True), True),
        ("tree 100 x 1000, plain", lambda: tree(100, 1000, False), False),
        ("tree 100 x 1000, bounded", lambda: tree(100, 1000, True), False),
        ("tree 100 x 1000, bounded, half active", lambda: tree(100, 1000, True), True),
        ("deep 10^5 (fanout 10, depth 5), plain", lambda: deep(10, 5), False),
    ]
    print(f"{'case':42} {'roles':>7} {'build s':>8} {'compute s':>10}")
    for name, build, half_active in cases:
        start = time.perf_counter()
        roles = build()
        built = time.perf_counter() - start
        active: Collection[str] | None = None
        if half_active:
            parents = {p.rpartition("/")[0] for p in roles}
            leaves = [p for p in roles if p not in parents]
            active = set(leaves[::2])
        seconds = best_of(args.repeat, partial(compute_fair_shares, roles, TOTAL, active))
        print(f"{name:42} {len(roles):>7} {built:>8.3f} {seconds:>10.3f}")


if __name__ == "__main__":
    main()
