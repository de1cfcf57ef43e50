"""Invariants of the master's bookkeeping, checked in tests after every step.

What must always hold, whatever failed:

- per agent, what the allocator counts as allocated is exactly its tasks plus
  its outstanding offers, and never more than its total (so allocated plus
  free equals total, and no two offers can share resources);
- per framework, the allocator's allocation is exactly its tasks plus its
  offers, and the frameworks' allocations add up to the agents';
- every offer belongs to exactly one framework and one live agent;
- every running task is in exactly one place: its framework's and its agent's
  books agree;
- an implicit reconciliation waits only while its framework is connected and
  an agent holding its tasks is still re-registering (else its answer is owed).

`check` is O(agents + frameworks + tasks + offers): cheap enough to run after
every allocation cycle and every call when `MasterConfig.check_invariants` is
on (tests), too slow to leave on for a large production cluster.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mesolite.resources import EMPTY, Resources

if TYPE_CHECKING:
    from mesolite.master.core import MasterCore


def check(master: MasterCore) -> list[str]:
    """Every violated invariant, described; empty when all hold."""
    problems: list[str] = []
    allocator = master.allocator
    on_agent: dict[str, Resources] = {}
    of_framework: dict[str, Resources] = {}

    def add(book: dict[str, Resources], key: str, amount: Resources) -> None:
        book[key] = book.get(key, EMPTY) + amount

    for offer_id, outstanding in master.offers.items():
        offer = outstanding.offer
        framework = master.frameworks.get(offer.framework_id)
        if framework is None or offer_id not in framework.offers:
            problems.append(f"offer {offer_id} is not in its framework's books")
        if offer.agent_id not in master.agents:
            problems.append(f"offer {offer_id} is for unknown agent {offer.agent_id}")
            continue
        add(on_agent, offer.agent_id, offer.resources)
        add(of_framework, offer.framework_id, offer.resources)
    for framework in master.frameworks.values():
        for offer_id in framework.offers:
            if offer_id not in master.offers:
                problems.append(
                    f"framework {framework.framework_id} holds unknown offer {offer_id}"
                )

    seen: dict[tuple[str, str], str] = {}
    for framework in master.frameworks.values():
        for task_id, task in framework.tasks.items():
            key = (framework.framework_id, task_id)
            agent = master.agents.get(task.agent_id)
            if agent is None:
                problems.append(f"task {task_id} is on unknown agent {task.agent_id}")
                continue
            if agent.tasks.get(key) is not task:
                problems.append(f"task {task_id} is not in agent {task.agent_id}'s books")
            if task.state.is_terminal:
                problems.append(f"task {task_id} is {task.state.value} but still running")
            seen[key] = task.agent_id
            add(on_agent, task.agent_id, task.spec.resources)
            add(of_framework, framework.framework_id, task.spec.resources)
    for agent in master.agents.values():
        for key in agent.tasks:
            if seen.get(key) != agent.agent_id:
                problems.append(f"agent {agent.agent_id} runs task {key[1]} its framework lacks")

    agents_total = EMPTY
    for agent in master.agents.values():
        allocated = allocator.agent_allocated(agent.agent_id)
        agents_total = agents_total + allocated
        if not agent.total.contains(allocated):
            problems.append(f"agent {agent.agent_id}: allocated {allocated} > total {agent.total}")
        expected = on_agent.get(agent.agent_id, EMPTY)
        if allocated != expected:
            problems.append(
                f"agent {agent.agent_id}: allocator counts {allocated}, "
                f"tasks and offers hold {expected}"
            )
    frameworks_total = EMPTY
    for framework_id in master.frameworks:
        allocated = allocator.framework_allocation(framework_id)
        frameworks_total = frameworks_total + allocated
        expected = of_framework.get(framework_id, EMPTY)
        if allocated != expected:
            problems.append(
                f"framework {framework_id}: allocator counts {allocated}, "
                f"tasks and offers hold {expected}"
            )
    for framework in master.frameworks.values():
        waiting = framework.deferred_reconciliations
        if waiting and (
            not framework.connected or not master._tasks_expected(framework.framework_id)
        ):
            what = f"framework {framework.framework_id}: reconciliation {waiting[0]}"
            problems.append(f"{what} waits for nothing")
    if frameworks_total != agents_total:
        problems.append(f"frameworks hold {frameworks_total}, agents lend {agents_total}")
    # The health check reads agents in this order and stops at the first not silent.
    order = list(master._by_last_seen)
    if sorted(order) != sorted(master.agents):
        problems.append("the agents by last heard from are not the agents")
    elif [master.agents[a].last_seen for a in order] != sorted(
        master.agents[a].last_seen for a in order
    ):
        problems.append("the agents by last heard from are out of order")
    return problems
