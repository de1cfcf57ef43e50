"""`mesolite experiment properties`: the DRF paper's table of properties, reproduced.

For each policy (asset fairness, CEEI, DRF) and each property of
`fairness_properties`, hypothesis searches random instances for a case where
the property fails (`hypothesis.find`, derandomized: the same answer every
run). Found: the property is refuted, and hypothesis shrinks the case to the
smallest it can (fewest users and resources, smallest numbers), printed as the
counterexample. Not found in `examples` instances: it holds on all of them
(exactly for asset fairness and DRF; within the proven error bounds for CEEI).

Each property is searched first on instances where every user needs every
resource (demands 1-6), then, if it held, on instances where some demands are 0
(a user that needs no GPUs): the paper's proofs do not always cover those.
Instances have 2-4 users, 1-3 resources and capacities 1-20 (a lie declares
0-8 of each resource; growth adds 0-10 of each). Single-resource fairness
draws instances with one resource, bottleneck fairness instances where one
resource is every user's dominant one.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from hypothesis import HealthCheck, find, settings
from hypothesis import strategies as st
from hypothesis.errors import NoSuchExample

from mesolite.lab.fairness_properties import (
    PROPERTIES,
    Growth,
    Instance,
    Lie,
    Policy,
    Property,
    policies,
)

DEFAULT_EXAMPLES = 500
POLICY_NAMES = {"asset": "Asset fairness", "ceei": "CEEI", "drf": "DRF"}
DOMAINS = ("every user needs every resource", "some demands are 0")


# What the search draws ----------------------------------------------------------------


@st.composite
def instances(draw: st.DrawFn, positive: bool, resources: tuple[int, int] = (1, 3)) -> Instance:
    names = ["cpus", "mem", "disk"][: draw(st.integers(*resources))]
    capacity = {r: draw(st.integers(1, 20)) for r in names}
    low = 1 if positive else 0
    demands: dict[str, dict[str, int]] = {}
    for user in "ABCD"[: draw(st.integers(2, 4))]:
        demand = {r: draw(st.integers(low, 6)) for r in names}
        if not any(demand.values()):
            demand[names[0]] = 1
        demands[user] = demand
    return Instance(capacity, demands)


@st.composite
def bottlenecks(draw: st.DrawFn, positive: bool) -> Instance:
    """Instances where the first resource is every user's dominant one."""
    inst = draw(instances(positive, resources=(2, 3)))
    first = next(iter(inst.capacity))
    demands = {}
    for u, d in inst.demands.items():
        # Raise its demand for the first resource until that share is the largest.
        need = max(math.ceil(d[r] * inst.capacity[first] / inst.capacity[r]) for r in inst.capacity)
        demands[u] = {**d, first: max(need, d[first], 1)}
    return Instance(inst.capacity, demands)


@st.composite
def lies(draw: st.DrawFn, positive: bool) -> Lie:
    inst = draw(instances(positive))
    liar = draw(st.sampled_from(sorted(inst.demands)))
    declared = {r: draw(st.integers(0, 8)) for r in inst.capacity}
    if not any(declared.values()):
        declared[next(iter(inst.capacity))] = 1
    return Lie(inst, liar, declared)


@st.composite
def growths(draw: st.DrawFn, positive: bool) -> Growth:
    inst = draw(instances(positive))
    added = {r: draw(st.integers(0, 10)) for r in inst.capacity}
    if not any(added.values()):
        added[next(iter(inst.capacity))] = 1
    return Growth(inst, added)


def cases(kind: str, positive: bool) -> st.SearchStrategy[object]:
    """The cases a property is checked on (`Property.case`)."""
    if kind == "one resource":
        return instances(positive, resources=(1, 1))
    strategy: Callable[[bool], st.SearchStrategy[object]] = {
        "instance": instances,
        "bottleneck": bottlenecks,
        "lie": lies,
        "growth": growths,
    }[kind]
    return strategy(positive)


# The search ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Verdict:
    """One cell: whether the property held, and if not, where and how it failed."""

    prop: Property
    policy: str
    holds_positive: bool  # on instances where every user needs every resource
    holds_any: bool  # also where some demands are 0
    examples: int
    counterexample: object | None = None
    failure: str | None = None


def counterexample(
    prop: Property, policy: Policy, positive: bool, examples: int
) -> tuple[object, str] | None:
    """The smallest case hypothesis finds where `prop` fails for `policy`, or None."""
    try:
        case = find(
            cases(prop.case, positive),
            lambda c: prop.check(policy, c) is not None,
            settings=settings(
                max_examples=examples,
                derandomize=True,
                database=None,
                deadline=None,
                suppress_health_check=list(HealthCheck),
            ),
        )
    except NoSuchExample:
        return None
    failure = prop.check(policy, case)
    assert failure is not None
    return case, failure


def judge(prop: Property, name: str, policy: Policy, examples: int) -> Verdict:
    found = counterexample(prop, policy, True, examples)
    if found is not None:
        return Verdict(prop, name, False, False, examples, *found)
    if prop.case == "one resource":  # every user needs the one resource
        return Verdict(prop, name, True, True, examples)
    found = counterexample(prop, policy, False, examples)
    if found is not None:
        return Verdict(prop, name, True, False, examples, *found)
    return Verdict(prop, name, True, True, examples)


def judge_all(
    examples: int = DEFAULT_EXAMPLES, progress: Callable[[str], None] | None = None
) -> list[Verdict]:
    verdicts = []
    for prop in PROPERTIES:
        for name, policy in policies().items():
            started = time.monotonic()
            verdicts.append(judge(prop, name, policy, examples))
            if progress is not None:
                progress(f"{prop.name}, {POLICY_NAMES[name]}: {time.monotonic() - started:.1f}s")
    return verdicts


# The table ----------------------------------------------------------------------------


def _mark(holds: bool) -> str:
    return "✓" if holds else "✗"


def render(verdicts: Sequence[Verdict]) -> str:
    """The paper's table beside the one found here, in Markdown, and the counterexamples."""
    header = ["Property"]
    for name in POLICY_NAMES.values():
        header += [f"{name}: paper", f"{name}: here"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    notes: list[str] = []
    for prop in PROPERTIES:
        row = [prop.name]
        for key in POLICY_NAMES:
            v = next(v for v in verdicts if v.prop is prop and v.policy == key)
            paper = prop.paper[key]
            if v.holds_any:
                here = "✓"
            else:
                notes.append(f"{prop.name}, {POLICY_NAMES[key]}: {v.counterexample}: {v.failure}.")
                ref = f"[{len(notes)}]"
                here = f"✗ {ref}" if not v.holds_positive else f"✓, ✗ with zero demands {ref}"
            if v.holds_positive != paper:
                here = f"**{here}**"
            row += [_mark(paper), here]
        lines.append("| " + " | ".join(row) + " |")
    examples = verdicts[0].examples if verdicts else 0
    lines += [
        "",
        f"✓: no counterexample in {examples} random instances (derandomized) where every "
        f"user needs every resource, nor in {examples} where some demands are 0; "
        "exactly for asset fairness and DRF, within CEEI's proven error bounds. "
        "✗ [k]: refuted, by counterexample k, the smallest hypothesis found. "
        "Bold: not what the paper's table says.",
        "",
    ]
    lines += [f"{k}. {note}" for k, note in enumerate(notes, start=1)]
    return "\n".join(lines) + "\n"


def run(out: Path | None, examples: int) -> int:
    """`mesolite experiment properties`: print the table; write it to `out` if given."""
    if examples < 1:
        print("--examples must be at least 1", file=sys.stderr)
        return 2
    verdicts = judge_all(examples, progress=lambda line: print(line, file=sys.stderr))
    table = render(verdicts)
    print(table, end="")
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(table)
        print(f"wrote {out}", file=sys.stderr)
    return 0
