"""The real allocator over random role trees with churn, against an independent model.

Hypothesis builds a random role tree (depth up to 4, weights including 0,
guarantees and limits on cpus, mem and gpus at any level, limits of 0),
random agents and frameworks (several per role, in inner roles too, ids that
sort in the reverse of subscription order), then drives the allocator through
churn: frameworks joining and leaving, disconnecting, suppressing and
reviving; offers answered by launching tasks, declining with filters or being
rescinded; tasks ending; the fake clock moving past filters; agents added,
deactivated and removed; roles reconfigured and reweighted; tasks reported by
agents (`grant`). After every step an allocation cycle runs, and:

- every offer is checked against `tests.allocator_model` (written from the
  documentation, recomputing everything from scratch): the framework is the
  first in the documented walk that has not filtered the agent and whose cut
  offer is large enough, and the offer is exactly the agent's free resources
  cut to the least headroom of its roles' limits;
- every active agent left without an offer has no such framework (eligibility
  only shrinks within a cycle, so checking at the end is enough);
- no agent is offered twice in a cycle, no inactive agent at all;
- no role's holdings rise above any of its limits (a role already above one,
  after a reconfiguration or tasks reported by an agent, does not grow in it);
- the books add up: what the allocator says each agent, framework and role
  holds equals the sums of the offers and tasks given out, nothing exceeds an
  agent's total, the cluster total is the sum of the agents', the set of
  roles and of active roles, and every weighted share, match the model.

CI runs the `ci` profile: derandomized, no example database, so every run
explores the same examples. `MESOLITE_HYPOTHESIS_PROFILE=long` explores new
random examples, many more of them, with longer runs of steps.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from mesolite.master.allocator import Allocator, RoleSettings
from tests.allocator_model import (
    DEFAULT_ROLE,
    Model,
    RoleConfig,
    Units,
    lineage,
    resources,
    units,
)
from tests.simulate import FakeClock

_BASE = settings(
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
CI = settings(_BASE, max_examples=200, stateful_step_count=60, derandomize=True)
PROFILES = {
    # CI: the same examples every run.
    "ci": CI,
    # On demand: new random examples, many more, longer runs.
    "long": settings(_BASE, max_examples=5000, stateful_step_count=100),
    # For mutation testing and planted bugs: the CI examples, but stop at the
    # first failure without shrinking it (shrinking a run of steps takes minutes).
    "fail-fast": settings(CI, phases=[Phase.explicit, Phase.generate], report_multiple_bugs=False),
    # For each mutant of a mutation run (`make mutation`), where every call goes
    # through mutmut's trampolines: a quarter of the CI examples, no shrinking.
    "mutation": settings(
        CI, max_examples=50, phases=[Phase.explicit, Phase.generate], report_multiple_bugs=False
    ),
}
PROFILE = os.environ.get("MESOLITE_HYPOTHESIS_PROFILE", "ci")

NAMES = ("a", "b", "c")
RESOURCE_NAMES = ("cpus", "mem", "gpus")
# Largest amounts in thousandths, per resource, for guarantees and limits.
SCALE = {"cpus": 8_000, "mem": 8_192_000, "gpus": 2_000}
REFUSE_SECONDS = (0.0, 0.0, 1.0, 5.0, 1e6)


@st.composite
def role_trees(draw: st.DrawFn) -> list[str]:
    """A few role paths, each under an earlier one or at the top: nesting is common."""
    paths: list[str] = []
    for _ in range(draw(st.integers(1, 6))):
        inner = [p for p in paths if p.count("/") < 3]
        parent = draw(st.sampled_from(["", *inner]))
        name = draw(st.sampled_from(NAMES))
        path = f"{parent}/{name}" if parent else name
        if path not in paths:
            paths.append(path)
    return paths


def random_paths() -> st.SearchStrategy[str]:
    """Any path up to depth 4, or the default role."""
    nested = st.lists(st.sampled_from(NAMES), min_size=1, max_size=4).map("/".join)
    return st.one_of(st.just(DEFAULT_ROLE), nested)


def amounts(zero: bool = False) -> st.SearchStrategy[Units]:
    """Some of the resources, each up to its scale in steps of an eighth."""
    return st.dictionaries(
        st.sampled_from(RESOURCE_NAMES), st.integers(0 if zero else 1, 8), min_size=1
    ).map(lambda d: {n: SCALE[n] * k // 8 for n, k in d.items()})


def role_configs() -> st.SearchStrategy[RoleConfig]:
    return st.builds(
        RoleConfig,
        weight=st.sampled_from((1.0, 1.0, 2.0, 3.0, 0.5, 0.0)),
        guarantee=st.one_of(st.just({}), amounts()),
        limit=st.one_of(st.none(), amounts(zero=True)),
    )


def configs(paths: list[str]) -> st.SearchStrategy[dict[str, RoleConfig]]:
    """Settings for some of the tree's roles (and maybe one more), in a random order."""
    chosen = st.lists(st.sampled_from([*paths, DEFAULT_ROLE]), unique=True)
    extra = st.lists(random_paths(), max_size=1)
    return st.tuples(chosen, extra).flatmap(
        lambda c: st.fixed_dictionaries({p: role_configs() for p in dict.fromkeys(c[0] + c[1])})
    )


def agent_totals() -> st.SearchStrategy[Units]:
    return st.fixed_dictionaries(
        {
            "cpus": st.integers(1, 16).map(lambda k: k * 500),
            "mem": st.integers(1, 32).map(lambda k: k * 256_000),
        },
        optional={"gpus": st.integers(1, 2).map(lambda k: k * 1000), "disk": st.just(10_000_000)},
    )


def settings_of(config: dict[str, RoleConfig]) -> dict[str, RoleSettings]:
    return {
        path: RoleSettings(
            weight=c.weight,
            guarantee=resources(c.guarantee),
            limit=None if c.limit is None else {n: u / 1000 for n, u in c.limit.items()},
        )
        for path, c in config.items()
    }


@dataclass
class Holding:
    framework_id: str
    agent_id: str
    amounts: Units


class AllocatorMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.allocator = Allocator(self.clock, seed=0)
        self.model = Model()
        self.offers: list[Holding] = []
        self.tasks: list[Holding] = []
        self.next_framework = 0
        self.next_agent = 0
        self.cycles = 0
        self.tree: list[str] = []

    # Setting up ----------------------------------------------------------------

    @initialize(tree=role_trees(), data=st.data())
    def setup(self, tree: list[str], data: st.DataObject) -> None:
        self.tree = tree
        self.allocator = Allocator(self.clock, seed=data.draw(st.integers(0, 2**16)))
        self.configure(data.draw(configs(tree)))
        for total in data.draw(st.lists(agent_totals(), min_size=1, max_size=6)):
            self.add_agent_now(total)
        for _ in range(data.draw(st.integers(1, 8))):
            self.subscribe(data.draw(self.paths()), data.draw(st.booleans()))
        self.cycle()

    def paths(self) -> st.SearchStrategy[str]:
        """Mostly the tree's roles, sometimes any other."""
        known = st.sampled_from([*self.tree, DEFAULT_ROLE])
        inner = [p for p in self.tree if any(q.startswith(p + "/") for q in self.tree)]
        if not inner:
            return st.one_of(known, known, known, random_paths())
        # Frameworks in inner roles compete beside child roles: make that common.
        return st.one_of(known, known, st.sampled_from(inner), random_paths())

    def configure(self, config: dict[str, RoleConfig]) -> None:
        self.allocator.configure_roles(settings_of(config))
        self.model.configure_roles(config)

    def add_agent_now(self, total: Units) -> None:
        agent_id = f"s{self.next_agent}"
        self.next_agent += 1
        self.allocator.add_agent(agent_id, resources(total))
        self.model.add_agent(agent_id, total)

    def subscribe(self, path: str, connected: bool) -> None:
        # Ids sort in the reverse of subscription order: ids must never break ties.
        framework_id = f"fw-{999 - self.next_framework:03d}"
        self.next_framework += 1
        new_role = self.allocator.add_framework(framework_id, path, connected=connected)
        assert new_role == self.model.add_framework(framework_id, path, connected)

    # Churn: each step changes something, then a cycle runs -----------------------

    @rule(data=st.data(), connected=st.booleans())
    def framework_joins(self, data: st.DataObject, connected: bool) -> None:
        self.subscribe(data.draw(self.paths()), connected)
        self.cycle()

    @precondition(lambda self: self.model.frameworks)
    @rule(data=st.data())
    def framework_leaves(self, data: st.DataObject) -> None:
        framework_id = data.draw(st.sampled_from(sorted(self.model.frameworks)))
        self.allocator.remove_framework(framework_id)
        self.model.remove_framework(framework_id)
        self.offers = [o for o in self.offers if o.framework_id != framework_id]
        self.tasks = [t for t in self.tasks if t.framework_id != framework_id]
        self.cycle()

    @precondition(lambda self: self.model.frameworks)
    @rule(data=st.data(), suppress=st.booleans())
    def framework_suppresses_or_revives(self, data: st.DataObject, suppress: bool) -> None:
        framework_id = data.draw(st.sampled_from(sorted(self.model.frameworks)))
        if suppress:
            self.allocator.suppress(framework_id)
            self.model.frameworks[framework_id].suppressed = True
        else:
            self.allocator.revive(framework_id)
            self.model.revive(framework_id)
        self.cycle()

    @precondition(lambda self: self.model.frameworks)
    @rule(data=st.data(), connected=st.booleans())
    def framework_connection_changes(self, data: st.DataObject, connected: bool) -> None:
        framework_id = data.draw(st.sampled_from(sorted(self.model.frameworks)))
        if connected:
            self.allocator.connect_framework(framework_id)
        else:
            self.allocator.disconnect_framework(framework_id)
        self.model.frameworks[framework_id].connected = connected
        self.cycle()

    @precondition(lambda self: self.offers)
    @rule(data=st.data())
    def offer_answered(self, data: st.DataObject) -> None:
        index = data.draw(st.integers(0, len(self.offers) - 1))
        self.answer(self.offers.pop(index), data)
        self.cycle()

    @precondition(lambda self: self.offers)
    @rule(data=st.data())
    def every_offer_answered(self, data: st.DataObject) -> None:
        offers, self.offers = self.offers, []
        for offer in offers:
            self.answer(offer, data)
        self.cycle()

    def answer(self, offer: Holding, data: st.DataObject) -> None:
        """Launch a task on part of the offer, or not, and give the rest back, maybe filtered."""
        launch = data.draw(st.booleans())
        task: Units = {}
        if launch:
            task = {
                name: u * data.draw(st.integers(0, 4)) // 4 for name, u in offer.amounts.items()
            }
            task = {n: u for n, u in task.items() if u}
        rest = {n: u - task.get(n, 0) for n, u in offer.amounts.items()}
        rest = {n: u for n, u in rest.items() if u}
        refuse = data.draw(st.sampled_from(REFUSE_SECONDS))
        if task:
            self.tasks.append(Holding(offer.framework_id, offer.agent_id, task))
        self.allocator.recover(offer.framework_id, offer.agent_id, resources(rest), refuse)
        self.model.recover(offer.framework_id, offer.agent_id, rest, refuse)

    @precondition(lambda self: self.tasks)
    @rule(data=st.data())
    def task_ends(self, data: st.DataObject) -> None:
        task = self.tasks.pop(data.draw(st.integers(0, len(self.tasks) - 1)))
        self.allocator.recover(task.framework_id, task.agent_id, resources(task.amounts))
        self.model.recover(task.framework_id, task.agent_id, task.amounts, 0.0)
        self.cycle()

    @rule(seconds=st.sampled_from((0.5, 1.0, 4.0, 5.0, 10.0)))
    def time_passes(self, seconds: float) -> None:
        self.clock.now += seconds
        self.model.now = self.clock.now
        self.cycle()

    @precondition(lambda self: len(self.model.agents) < 8)
    @rule(total=agent_totals())
    def agent_joins(self, total: Units) -> None:
        self.add_agent_now(total)
        self.cycle()

    @precondition(lambda self: self.model.agents)
    @rule(data=st.data())
    def agent_lost(self, data: st.DataObject) -> None:
        agent_id = data.draw(st.sampled_from(sorted(self.model.agents)))
        self.allocator.remove_agent(agent_id)
        self.model.remove_agent(agent_id)
        self.offers = [o for o in self.offers if o.agent_id != agent_id]
        self.tasks = [t for t in self.tasks if t.agent_id != agent_id]
        self.cycle()

    @precondition(lambda self: self.model.agents)
    @rule(data=st.data(), active=st.booleans())
    def agent_connection_changes(self, data: st.DataObject, active: bool) -> None:
        agent_id = data.draw(st.sampled_from(sorted(self.model.agents)))
        if active:
            self.allocator.activate_agent(agent_id)
        else:
            self.allocator.deactivate_agent(agent_id)
        self.model.agents[agent_id].active = active
        self.cycle()

    @precondition(lambda self: self.model.agents and self.model.frameworks)
    @rule(data=st.data())
    def agent_reports_a_task(self, data: st.DataObject) -> None:
        """An agent re-registering with a task the allocator did not place (`grant`)."""
        agent_id = data.draw(st.sampled_from(sorted(self.model.agents)))
        framework_id = data.draw(st.sampled_from(sorted(self.model.frameworks)))
        free = self.model.free(agent_id)
        task = {n: u * data.draw(st.integers(0, 2)) // 2 for n, u in free.items()}
        task = {n: u for n, u in task.items() if u}
        if task:
            self.allocator.grant(framework_id, agent_id, resources(task))
            self.model.grant(framework_id, agent_id, task)
            self.tasks.append(Holding(framework_id, agent_id, task))
        self.cycle()

    @rule(data=st.data())
    def roles_reloaded(self, data: st.DataObject) -> None:
        self.configure(data.draw(configs(self.tree)))
        self.cycle()

    @rule(data=st.data(), weight=st.sampled_from((0.5, 2.0, 5.0)))
    def role_reweighted(self, data: st.DataObject, weight: float) -> None:
        path = data.draw(self.paths())
        self.allocator.set_role_weight(path, weight)
        self.model.set_role_weight(path, weight)
        self.cycle()

    # The cycle and its checks ----------------------------------------------------

    def cycle(self) -> None:
        model = self.model
        limits_before = {path: model.role_held(path) for path in model.roles}
        decisions = self.allocator.allocate()
        self.cycles += 1
        offered: set[str] = set()
        for d in decisions:
            assert d.agent_id not in offered, f"{d.agent_id} offered twice in one cycle"
            offered.add(d.agent_id)
            expected = model.choose(d.agent_id)
            got = (d.framework_id, units(d.resources))
            assert got == expected, (
                f"cycle {self.cycles}: agent {d.agent_id} went to {got}, the rule says "
                f"{expected}; walk {list(model.walk())}"
            )
            model.grant(d.framework_id, d.agent_id, got[1])
            self.offers.append(Holding(d.framework_id, d.agent_id, got[1]))
        for agent_id in sorted(model.agents):
            if agent_id not in offered:
                assert model.choose(agent_id) is None, (
                    f"cycle {self.cycles}: agent {agent_id} was not offered; "
                    f"the rule gives it to {model.choose(agent_id)}"
                )
        for path, role in model.roles.items():
            if role.limit is None:
                continue
            held, before = model.role_held(path), limits_before.get(path, {})
            for name, cap in role.limit.items():
                assert held.get(name, 0) <= max(cap, before.get(name, 0)), (
                    f"role {path} holds {held.get(name, 0)} of {name}, limit {cap}"
                )

    @invariant()
    def books_add_up(self) -> None:
        model, allocator = self.model, self.allocator
        assert units(allocator.total) == model.total
        for agent_id, agent in model.agents.items():
            held: Units = {}
            for h in self.offers + self.tasks:
                if h.agent_id == agent_id:
                    for n, u in h.amounts.items():
                        held[n] = held.get(n, 0) + u
            assert units(allocator.agent_allocated(agent_id)) == held == model.agent_held(agent_id)
            assert all(u <= agent.total.get(n, 0) for n, u in held.items())
        for framework_id in model.frameworks:
            assert units(allocator.framework_allocation(framework_id)) == model.framework_held(
                framework_id
            )
            assert allocator.framework_share(framework_id) == model.framework_share(framework_id)
        tree = allocator.roles
        assert set(tree.role_paths()) == set(model.roles)
        assert tree.active_roles() == model.active_roles()
        for path in model.roles:
            assert units(tree.role_allocation(path)) == model.role_held(path), path
            assert tree.role_share(path) == model.role_share(path), path
            assert tree.role_weight(path) == model.roles[path].weight
        # Frameworks' holdings add up to their roles', level by level.
        for path in model.roles:
            total: Units = {}
            for f in model.frameworks.values():
                if path in lineage(f.role):
                    for n, u in units(allocator.framework_allocation(f.framework_id)).items():
                        total[n] = total.get(n, 0) + u
            assert units(tree.role_allocation(path)) == total, path


# Only CI's run is held to the suite's 120 s: the long profile takes as long as
# it takes, and so does a mutation run (mutmut's trampolines slow every call).
@pytest.mark.timeout(120 if PROFILE == "ci" else 0)
@pytest.mark.slow  # about 25 s: the full suite runs it, make test-fast does not
def test_allocator_follows_the_documented_rule_over_random_role_trees() -> None:
    run_state_machine_as_test(AllocatorMachine, settings=PROFILES[PROFILE])
