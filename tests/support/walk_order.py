"""The order in which an allocation cycle visits the agents (shuffled by the seed)."""

from __future__ import annotations

from mesolite.master.allocator import Allocator
from mesolite.resources import Resources
from tests.simulate import FakeClock


def walk_order(agents: dict[str, Resources], seed: int) -> list[str]:
    """The order in which a cycle of an allocator with these agents (added in this
    order) and this seed visits them: the offers to a lone framework that declared
    nothing, one whole agent each, in the order made."""
    allocator = Allocator(FakeClock(), seed=seed, packing=True)
    for agent_id, total in agents.items():
        allocator.add_agent(agent_id, total)
    allocator.add_framework("probe", "*")
    return [d.agent_id for d in allocator.allocate()]


def seed_walking(agents: dict[str, Resources], *order: str) -> int:
    """A seed whose cycle visits the agents `order` in that order (others anywhere)."""
    for seed in range(500):
        if [a for a in walk_order(agents, seed) if a in order] == list(order):
            return seed
    raise AssertionError(f"no seed walks {order} in that order")


def seed_walking_first(agents: dict[str, Resources], first: str) -> int:
    """A seed whose cycle visits `first` before every other agent."""
    for seed in range(500):
        if walk_order(agents, seed)[0] == first:
            return seed
    raise AssertionError(f"no seed walks {first} first")
