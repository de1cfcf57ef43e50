"""Hypothesis strategies for every message a client can send the master, valid or not.

    known = Known.of(master)                         # what the master has now
    first = data.draw(subscribes(known))             # a framework stream's first call
    call = data.draw(framework_calls(known, framework_id))
    register = data.draw(registers(known))           # an agent stream's first call
    agent_call = data.draw(agent_calls(known, agent_id))

Most messages are nearly valid: built from what the master has (its offers, tasks,
agents, frameworks and update ids) as a well-behaved client would build them, and
then one field broken (`Breakage`), sometimes none, sometimes all. So an input gets
past the checks before the one it breaks, and every check, and the code behind
them, is reached. A broken field takes values at and just past the master's bounds
(`master/validation.py`) and garbage: empty, NUL, newlines, path tricks, long
strings, NaN, infinities, negative and huge amounts, unknown enum numbers (proto3
enums are open), ids of someone else's offers, tasks, agents and frameworks.

One rule: what the master has decides the values drawn, never which draws are made.
Every choice among the master's things is one draw of an index (`pick`), whatever
there is to choose from, and no branch depends on it. Hypothesis requires it of a
test whose examples share a master (tests/test_fuzz_wire.py): there, the same draws
meet another state each time, and would otherwise be flagged as a flaky strategy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeAlias, TypeVar

from hypothesis import strategies as st

from mesolite.convert import task_state_to_proto
from mesolite.model import TaskState
from mesolite.v1 import agent_pb2, common_pb2, scheduler_pb2

if TYPE_CHECKING:
    from mesolite.master.master import Master

T = TypeVar("T")
Call = scheduler_pb2.Call
AgentCall = agent_pb2.AgentCall
State: TypeAlias = common_pb2.TaskState.ValueType
Source: TypeAlias = common_pb2.TaskStatus.Source.ValueType

# Strings ------------------------------------------------------------------------

# Lengths at and around the master's bounds (ids 200, names 256, resource names 64,
# environment values 16 KiB, commands 64 KiB), and one far past them all.
LENGTHS = (63, 64, 65, 128, 129, 200, 201, 256, 257, 1025, 16_385, 65_537, 300_000)
NASTY = (
    "",
    " ",
    "\t",
    "\n",
    "a\n",
    "*",
    "/",
    "//",
    ".",
    "..",
    "a/..",
    "../../etc/passwd",
    "a b",
    "a=b",
    "=",
    "\x00",
    "a\x00b",
    "%00",
    "%2e%2e",
    "é",
    "\U0001f600",
    "\u202e",
    "\ufeff",
    "TASK_RUNNING",
    "-",
    ":",
    "$(id)",
    "'",
    '"',
    "\\",
    "a/b/c/d/e",
    "a/*",
    "127.0.0.1:1/admin#",
)


def weighted(*choices: tuple[int, st.SearchStrategy[T]]) -> st.SearchStrategy[T]:
    """One of the strategies, each as often as its weight says; shrinks to the first.

    A composite, not `st.one_of`: many are built per message (from the ids the master
    has at that step), and hypothesis walks a new `one_of`'s whole tree to validate it.
    """
    return _weighted(choices)


@st.composite
def _weighted(draw: st.DrawFn, choices: tuple[tuple[int, st.SearchStrategy[T]], ...]) -> T:
    n = draw(st.integers(0, sum(weight for weight, _ in choices) - 1))
    for weight, strategy in choices:
        if n < weight:
            return draw(strategy)
        n -= weight
    raise AssertionError("unreachable")


# The strategies that do not depend on the master's state are built once: hypothesis
# validates each new strategy object, which costs more than most draws.
LONG_STRINGS = st.builds(lambda n, c: c * n, st.sampled_from(LENGTHS), st.sampled_from("a_é0-"))
# Garbage and edge cases: anything a string field can hold.
STRINGS = weighted((3, st.sampled_from(NASTY)), (2, st.text(max_size=12)), (1, LONG_STRINGS))
# Ids a careful client might make up: valid, but unknown to the master.
PLAIN_IDS = st.text("abt012._-:", min_size=1, max_size=6)
MADE_UP_IDS = weighted((2, PLAIN_IDS), (1, STRINGS))


INDEX = st.integers(0, 2**16 - 1)


def pick(pool: Sequence[T], fallback: T) -> st.SearchStrategy[T]:
    """One of `pool` (the master's things), or `fallback` when there is none: always a
    single draw of an index, whatever `pool` holds (the module's one rule)."""
    items = tuple(pool)
    return INDEX.map(lambda i: items[i % len(items)] if items else fallback)


def ids(pool: Sequence[str], fallback: str = "t1") -> st.SearchStrategy[str]:
    """Mostly an id from `pool` (real ones), else a made-up or a garbage one."""
    return weighted((4, pick(pool, fallback)), (1, PLAIN_IDS), (1, STRINGS))


def maybe(strategy: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """Often empty (the field left out), else `strategy`."""
    return weighted((1, st.just("")), (2, strategy))


MAYBE_STRINGS = maybe(STRINGS)

# Numbers ------------------------------------------------------------------------

INT32 = st.integers(-(2**31), 2**31 - 1)
EDGE_AMOUNTS = (
    0.0,
    -0.0,
    0.0004,  # rounds to no thousandths: an empty amount
    0.0005,
    0.0015,
    0.5,
    1.0,
    4.0,
    1024.0,
    1e15,  # the largest amount
    1.0000000000000002e15,
    1e300,
    -1.0,
    -5e-324,
    5e-324,
    math.nan,
    math.inf,
    -math.inf,
)
EDGE_SECONDS = (0.0, -0.0, 1e-9, 1.0, 5.0, 60.0, 31_536_000.0, 31_536_001.0, 1e300, -1.0)
AMOUNTS = weighted((3, st.sampled_from(EDGE_AMOUNTS)), (3, st.floats(0.0, 8.0)), (1, st.floats()))
SECONDS = weighted(
    (2, st.sampled_from(EDGE_SECONDS)),
    (1, st.sampled_from((math.nan, math.inf, -math.inf))),
    (1, st.floats()),
)
# Resources ------------------------------------------------------------------------

RESOURCE_NAMES = ("cpus", "mem", "disk", "gpus", "_x", "a.b-c")
BAD_RESOURCE_NAMES = ("", "1cpus", "cpus\n", "cp us", "cpus:", "é", "-x", ".x", "a" * 65)
ANY_RESOURCE_MAPS = weighted(
    (
        3,
        st.dictionaries(
            weighted(
                (4, st.sampled_from(RESOURCE_NAMES)),
                (1, st.sampled_from(BAD_RESOURCE_NAMES)),
                (1, st.text(max_size=6)),
            ),
            AMOUNTS,
            max_size=5,
        ),
    ),
    # Just past the bound on resource names (64), and well past it.
    (1, st.sampled_from((64, 65, 300)).map(lambda n: {f"r{i}": 1.0 for i in range(n)})),
)
GOOD_SHARES = st.sampled_from((0.001, 0.1, 0.5, 1.0))
BAD_SHARES = st.sampled_from((1.0000001, 2.0, 1e6))
ANY_SHARES = weighted((1, GOOD_SHARES), (1, BAD_SHARES))


@st.composite
def shares_of(
    draw: st.DrawFn, whole: dict[str, float], shares: st.SearchStrategy[float]
) -> dict[str, float]:
    """Some of `whole`'s resources (cpus if none), each a share of its amount."""
    chosen = draw(st.lists(INDEX, min_size=1, max_size=3))
    share = draw(shares)
    names = sorted(whole)
    if not names:
        return {"cpus": share}
    return {name: whole[name] * share for name in {names[i % len(names)] for i in chosen}}


@st.composite
def resource_maps(draw: st.DrawFn, offered: Sequence[dict[str, float]]) -> dict[str, float]:
    """Named amounts: a share of something offered (nearly valid), or anything."""
    whole = draw(pick(offered, {}))
    if draw(st.integers(0, 6)) < 3:
        return draw(ANY_RESOURCE_MAPS)
    return draw(shares_of(whole, ANY_SHARES))


# What the master knows --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KnownOffer:
    offer_id: str
    framework_id: str
    agent_id: str
    resources: dict[str, float]


@dataclass(frozen=True, slots=True)
class KnownTask:
    framework_id: str
    task_id: str
    agent_id: str
    resources: dict[str, float]
    state: State
    live: bool  # running on its agent (else ended, kept among the completed)
    update_ids: tuple[str, ...]


# What a pick of a task gives when the master has none: a task nobody has.
NO_TASK = KnownTask("f1", "t1", "a1", {"cpus": 1.0}, common_pb2.TASK_RUNNING, True, ())


@dataclass(frozen=True, slots=True)
class Known:
    """What the master has now, for inputs that name real things."""

    frameworks: tuple[str, ...] = ()
    roles: tuple[str, ...] = ()
    agents: dict[str, dict[str, float]] = field(default_factory=dict)  # id -> total
    offers: tuple[KnownOffer, ...] = ()
    tasks: tuple[KnownTask, ...] = ()

    @classmethod
    def of(cls, master: Master) -> Known:
        """What `master` has, agents still to re-register after a restart included."""
        frameworks = list(master.frameworks.values())
        agents = {a.agent_id: a.total.to_dict() for a in master.agents.values()}
        if master.recovering_agents:
            for entry in master.registry.agents():
                if entry.agent_id in master.recovering_agents:
                    agents[entry.agent_id] = entry.total.to_dict()
        running = task_state_to_proto(TaskState.RUNNING)
        return cls(
            frameworks=tuple(f.framework_id for f in frameworks),
            roles=tuple(sorted({f.info.role for f in frameworks})),
            agents=agents,
            offers=tuple(
                KnownOffer(o.offer_id, o.framework_id, o.agent_id, o.resources.to_dict())
                for o in (record.offer for record in master.offers.values())
            ),
            tasks=tuple(
                KnownTask(
                    t.framework_id,
                    t.spec.task_id,
                    t.agent_id,
                    t.spec.resources.to_dict(),
                    task_state_to_proto(t.state),
                    live,
                    tuple(sorted(t.applied_updates)),
                )
                for f in frameworks
                for live, records in ((True, f.tasks.values()), (False, f.completed))
                for t in records
            )
            + tuple(
                KnownTask(
                    e.framework_id,
                    e.task.task_id,
                    e.agent_id,
                    e.task.resources.to_dict(),
                    running,
                    True,
                    (),
                )
                for entries in master.recovering_agents.values()
                for e in entries
            ),
        )

    @property
    def update_ids(self) -> list[str]:
        return [u for t in self.tasks for u in t.update_ids]

    def offers_of(self, framework_id: str) -> list[KnownOffer]:
        return [o for o in self.offers if o.framework_id == framework_id]

    def tasks_of(self, framework_id: str, live: bool = True) -> list[KnownTask]:
        return [t for t in self.tasks if t.framework_id == framework_id and t.live >= live]

    def tasks_on(self, agent_id: str, live: bool = False) -> list[KnownTask]:
        return [t for t in self.tasks if t.agent_id == agent_id and t.live >= live]


class Breakage:
    """Which fields of a message to break: none (a valid message), one, or all of them."""

    def __init__(self, draw: st.DrawFn, *fields: str, broken: bool | None = None) -> None:
        """Without `broken`: valid in 2 of 10, all broken in 1 of 10, else one field."""
        self.draw = draw
        self.broken = ""
        how = draw(st.integers(0, 9)) if broken is None else 9 if broken else 0
        if how == 1:
            self.broken = "*"
        elif how >= 2:
            self.broken = fields[draw(st.integers(0, len(fields) - 1))]

    def __call__(self, name: str, good: st.SearchStrategy[T], bad: st.SearchStrategy[T]) -> T:
        return self.draw(bad if self.broken in (name, "*") else good)

    def __contains__(self, name: str) -> bool:
        return self.broken in (name, "*")


# Tasks ----------------------------------------------------------------------------------

FRESH_TASK_IDS = st.sampled_from([f"t{i}" for i in range(2, 10)])
BAD_IDS = weighted(
    (2, st.sampled_from(("t\n", "a b", "", "a" * 201, "../t", "\x00", "é"))), (1, STRINGS)
)
BAD_COMMANDS = weighted((3, st.sampled_from(("", "   ", "\n", "x" * 65_537))), (1, STRINGS))
GOOD_ENVIRONMENTS = st.sampled_from(({}, {"A": "1", "PATH": "/bin"}))
BAD_ENVIRONMENTS = weighted(
    (
        3,
        st.dictionaries(
            weighted(
                (3, st.sampled_from(("", "A=B", "\x00", "a" * 257, "A"))),
                (1, st.text(max_size=6)),
            ),
            weighted((1, st.text(max_size=8)), (2, st.sampled_from(("\x00", "x" * 16_385)))),
            min_size=1,
            max_size=3,
        ),
    ),
    (1, st.just({f"V{i}": "" for i in range(257)})),  # past the bound of 256
)


@st.composite
def task_infos(
    draw: st.DrawFn,
    known: Known,
    framework_id: str,
    agent_id: str,
    offered: dict[str, float],
    broken: bool | None = None,
) -> common_pb2.TaskInfo:
    """A task to launch with `offered` on `agent_id`."""
    b = Breakage(draw, "task_id", "name", "command", "resources", "agent_id", "env", broken=broken)
    in_use = [t.task_id for t in known.tasks_of(framework_id)]
    return common_pb2.TaskInfo(
        task_id=b("task_id", FRESH_TASK_IDS, weighted((2, ids(in_use)), (1, BAD_IDS))),
        name=b("name", st.sampled_from(("", "task")), STRINGS),
        command=b("command", st.just("sleep 30"), BAD_COMMANDS),
        resources=common_pb2.Resources(
            scalars=b(
                "resources",
                shares_of(offered, GOOD_SHARES),
                weighted((2, ANY_RESOURCE_MAPS), (1, shares_of(offered, BAD_SHARES))),
            )
        ),
        agent_id=b(
            "agent_id",
            st.sampled_from(("", agent_id)),
            ids([a for a in known.agents if a != agent_id], "a1"),
        ),
        environment=b("env", GOOD_ENVIRONMENTS, BAD_ENVIRONMENTS),
    )


# Framework calls ------------------------------------------------------------------------

GOOD_ROLES = st.sampled_from(("*", "a", "a/b", "eng"))
BAD_ROLES = weighted(
    (3, st.sampled_from(("denied", "denied/x", "bad role!", "/a", "a/", "a//b", "a/./b", ".."))),
    (1, STRINGS),
)
# A framework's Unix user: none, or one the fuzzed master's ACLs allow (`fuzzing.ACLS`);
# broken: invalid names, root (which they do not name), one they do not allow.
GOOD_USERS = st.sampled_from(("", "", "svc"))
BAD_USERS = weighted(
    (3, st.sampled_from(("-x", "1000", "a b", "root\n", "a" * 33, "root", "other"))),
    (1, STRINGS),
)
GOOD_SECONDS = st.sampled_from((0.0, 1.0, 5.0, 60.0))
GOOD_FILTERS = weighted(
    (2, st.none()), (1, GOOD_SECONDS.map(lambda s: scheduler_pb2.Filters(refuse_seconds=s)))
)
BAD_FILTERS = SECONDS.map(lambda s: scheduler_pb2.Filters(refuse_seconds=s))
TOO_MANY_IDS = [f"o{i}" for i in range(10_001)]  # past the bound of 10,000 per call
TOO_MANY_TASKS = [  # past the bound of 1,000 per call
    common_pb2.TaskInfo(task_id=f"t{i}", command="true", resources=common_pb2.Resources())
    for i in range(1001)
]
CALL_KINDS = tuple(
    kind
    for kind, weight in (
        ("accept", 8),
        ("decline", 2),
        ("kill", 2),
        ("acknowledge", 2),
        ("reconcile", 2),
        ("revive", 1),
        ("suppress", 1),
        ("subscribe", 1),
        ("none", 1),  # no call at all
        ("teardown", 1),  # made rare below: it ends the stream and the framework
    )
    for _ in range(weight)
)


@st.composite
def framework_infos(draw: st.DrawFn, known: Known) -> scheduler_pb2.FrameworkInfo:
    """A new framework's info, or a known one's (subscribing again)."""
    b = Breakage(draw, "name", "role", "failover", "framework_id", "user")
    return scheduler_pb2.FrameworkInfo(
        name=b("name", st.sampled_from(("fw", "batch")), STRINGS),
        role=b("role", weighted((3, GOOD_ROLES), (1, pick(known.roles, "*"))), BAD_ROLES),
        failover_timeout_seconds=b("failover", GOOD_SECONDS, SECONDS),
        framework_id=b(
            "framework_id",
            maybe(pick(known.frameworks, "")),
            weighted((1, BAD_IDS), (1, PLAIN_IDS)),
        ),
        user=b("user", GOOD_USERS, BAD_USERS),
    )


@st.composite
def subscribes(draw: st.DrawFn, known: Known) -> Call:
    """A framework stream's first call: mostly SUBSCRIBE, sometimes not."""
    if draw(st.integers(0, 9)) == 0:
        return draw(framework_calls(known, ""))
    return Call(subscribe=Call.Subscribe(framework_info=draw(framework_infos(known))))


@st.composite
def offer_ids(draw: st.DrawFn, known: Known, framework_id: str, broken: bool) -> list[str]:
    """Some of the framework's offers on one agent; broken: anyone's, or none, or too many."""
    own = known.offers_of(framework_id)
    agent = draw(pick(sorted({o.agent_id for o in own}), ""))
    chosen = draw(st.lists(pick([o.offer_id for o in own if o.agent_id == agent], "o1")))
    if not broken:
        return list(dict.fromkeys(chosen)) or ["o1"]
    every = [o.offer_id for o in known.offers]
    return draw(
        weighted(
            (4, st.lists(ids(every, "o1"), min_size=1, max_size=3)),
            (1, st.just([])),
            (1, ids(every, "o1").map(lambda o: [o, o])),
            (1, st.just(TOO_MANY_IDS)),
        )
    )


@st.composite
def accepts(draw: st.DrawFn, known: Known, framework_id: str) -> Call.Accept:
    b = Breakage(draw, "offer_ids", "tasks", "filters")
    chosen = draw(offer_ids(known, framework_id, "offer_ids" in b))
    named = [o for o in known.offers if o.offer_id in chosen]
    agent_id = named[0].agent_id if named else ""
    offered: dict[str, float] = {}
    for o in named:
        for name, amount in o.resources.items():
            offered[name] = offered.get(name, 0.0) + amount
    tasks = draw(
        st.lists(
            task_infos(known, framework_id, agent_id, offered, broken="tasks" in b),
            min_size=1,
            max_size=3,
        )
    )
    if "tasks" in b and draw(st.integers(0, 4)) == 0:
        tasks = draw(st.sampled_from(([], tasks + tasks[:1], TOO_MANY_TASKS)))
    accept = Call.Accept(offer_ids=chosen, tasks=tasks)
    if (filters := b("filters", GOOD_FILTERS, BAD_FILTERS)) is not None:
        accept.filters.CopyFrom(filters)
    return accept


@st.composite
def framework_calls(draw: st.DrawFn, known: Known, framework_id: str) -> Call:
    """Any call a subscribed framework might send, with a call id (echoed on errors)."""
    kind = draw(st.sampled_from(CALL_KINDS))
    own = [t.task_id for t in known.tasks_of(framework_id)]
    others = [t.task_id for t in known.tasks if t.framework_id != framework_id]
    call = Call(call_id=draw(weighted((3, PLAIN_IDS), (1, STRINGS))))
    if kind == "accept":
        call.accept.CopyFrom(draw(accepts(known, framework_id)))
    elif kind == "decline":
        b = Breakage(draw, "offer_ids", "filters")
        call.decline.offer_ids.extend(draw(offer_ids(known, framework_id, "offer_ids" in b)))
        if (filters := b("filters", GOOD_FILTERS, BAD_FILTERS)) is not None:
            call.decline.filters.CopyFrom(filters)
    elif kind == "kill":
        call.kill.task_id = Breakage(draw, "task_id")("task_id", pick(own, "t2"), ids(others))
    elif kind == "acknowledge":
        call.acknowledge.CopyFrom(draw(acknowledges(known, framework_id)))
    elif kind == "reconcile":
        b = Breakage(draw, "task_ids")
        bad_ids = weighted(
            (3, st.lists(weighted((1, ids(others)), (1, BAD_IDS)), min_size=1)),
            (1, st.just(TOO_MANY_IDS)),
        )
        call.reconcile.task_ids.extend(
            b("task_ids", st.lists(pick(own, "t2"), max_size=3), bad_ids)
        )
    elif kind == "revive":
        call.revive.SetInParent()
    elif kind == "suppress":
        call.suppress.SetInParent()
    elif kind == "subscribe":
        call.subscribe.framework_info.CopyFrom(draw(framework_infos(known)))
    elif kind == "teardown" and draw(st.integers(0, 3)) == 0:
        call.teardown.SetInParent()
    elif kind == "teardown":
        call.revive.SetInParent()
    return call


@st.composite
def acknowledges(draw: st.DrawFn, known: Known, framework_id: str) -> Call.Acknowledge:
    """The acknowledgement of one of the framework's updates, or not quite."""
    b = Breakage(draw, "agent_id", "task_id", "update_id")
    updated = [t for t in known.tasks_of(framework_id, live=False) if t.update_ids]
    task = draw(pick(updated, NO_TASK))
    return Call.Acknowledge(
        agent_id=b("agent_id", st.just(task.agent_id), ids(list(known.agents), "a1")),
        task_id=b("task_id", st.just(task.task_id), MADE_UP_IDS),
        update_id=b(
            "update_id",
            pick(task.update_ids, "u1"),
            weighted((1, st.just("")), (1, ids(known.update_ids, "u1"))),
        ),
    )


# Agent calls ------------------------------------------------------------------------------

TOTALS = ({"cpus": 4.0, "mem": 4096.0}, {"cpus": 1.0, "mem": 512.0, "gpus": 1.0})
BAD_ADDRESSES = st.sampled_from(
    ("", "[::1]:1", "host:99999", "127.0.0.1:1/admin/secret#", "a" * 300, "http://x/", "\x00")
)
BAD_ATTRIBUTES = weighted(
    (2, st.dictionaries(MAYBE_STRINGS, STRINGS, min_size=1, max_size=3)),
    (1, st.just({f"k{i}": "v" for i in range(65)})),  # past the bound of 64
)
ISOLATIONS = ("", "cgroups-v2", "cgroups-v1", "process-tree")
UPDATE_IDS = st.sampled_from(("u1", "u2", "u3", "u4"))
GOOD_FIGURES = st.sampled_from((0.0, 0.25, 1.0, 128.0))
BAD_FIGURES = weighted((2, st.sampled_from((-1.0, math.nan, math.inf, 1e308))), (1, st.floats()))
REASONS = weighted((3, st.just(0)), (1, st.integers(1, 2)), (1, st.integers(3, 2**31 - 1))).map(
    common_pb2.TaskStatus.Reason.ValueType
)
GOOD_STATES = st.sampled_from(
    tuple(
        common_pb2.TaskState.Value(f"TASK_{s}")
        for s in ("STARTING", "RUNNING", "KILLING", "FINISHED", "FAILED", "KILLED", "LOST")
    )
)
BAD_STATES = weighted((1, st.just(0)), (1, st.integers(13, 20)), (1, INT32)).map(State)
TERMINAL_STATES = st.sampled_from(
    tuple(common_pb2.TaskState.Value(f"TASK_{s}") for s in ("FINISHED", "FAILED", "KILLED"))
)
REPORTS = (
    "its own, changed state",  # ended while the master was away, or running again
    "its own, changed resources",
    "someone else's",
    "made up",  # unknown to the master, of a known framework or not
    "made up, ended",
    "invalid",
)


@st.composite
def reported_tasks(
    draw: st.DrawFn, known: Known, agent_id: str, broken: bool
) -> list[agent_pb2.RunningTask]:
    """What an agent reports it runs when it registers again: its tasks as the master
    knows them; broken: some left out (a bit each), others changed or added."""
    here = known.tasks_on(agent_id, live=True)
    if not broken:
        return [_reported(t, t.resources, t.state) for t in here]
    kept = draw(INDEX)
    reported = [_reported(t, t.resources, t.state) for i, t in enumerate(here) if kept >> i & 1]
    elsewhere = [t for t in known.tasks if t.agent_id != agent_id]
    for _ in range(draw(st.integers(0, 2))):
        report = draw(st.sampled_from(REPORTS))
        if report.startswith("its own"):
            task = draw(pick(here, NO_TASK))
            if report == "its own, changed state":
                reported.append(_reported(task, task.resources, draw(GOOD_STATES)))
            else:
                changed = draw(resource_maps([task.resources]))
                reported.append(_reported(task, changed, task.state))
        elif report == "someone else's":
            task = draw(pick(elsewhere, NO_TASK))
            reported.append(_reported(task, task.resources, task.state))
        elif report.startswith("made up"):
            ended = report.endswith("ended")
            frameworks = weighted((1, pick(known.frameworks, "f1")), (1, PLAIN_IDS))
            made_up = agent_pb2.RunningTask(
                framework_id=draw(frameworks),
                task=draw(task_infos(known, "", agent_id, {"cpus": 1.0}, broken=False)),
                state=draw(TERMINAL_STATES if ended else GOOD_STATES),
            )
            reported.append(made_up)
        else:
            state = draw(BAD_STATES)
            if reported:
                reported[-1].state = state
    if draw(st.integers(0, 5)) == 0:
        reported += reported[:1]  # the same task twice
    return reported


def _reported(task: KnownTask, resources: dict[str, float], state: State) -> agent_pb2.RunningTask:
    info = common_pb2.TaskInfo(
        task_id=task.task_id,
        command="sleep 30",
        resources=common_pb2.Resources(scalars=resources),
        agent_id=task.agent_id,
    )
    return agent_pb2.RunningTask(framework_id=task.framework_id, task=info, state=state)


@st.composite
def registers(draw: st.DrawFn, known: Known) -> AgentCall:
    """An agent stream's first call: REGISTER as a new agent or as a known one again,
    one field broken or none; sometimes another call."""
    if draw(st.integers(0, 9)) == 0:
        return draw(agent_calls(known, ""))
    # "tasks" twice: what an agent reports is where re-registration goes deepest.
    b = Breakage(
        draw, "agent_id", "hostname", "address", "total", "attributes", "tasks", "tasks", "how"
    )
    again = draw(st.booleans())
    known_id = draw(pick(sorted(known.agents), ""))
    bad_ids = weighted((2, PLAIN_IDS), (1, BAD_IDS))
    agent_id = b("agent_id", st.just(known_id if again else ""), bad_ids)
    fresh_total = draw(st.sampled_from(TOTALS))
    total = known.agents.get(agent_id) or fresh_total
    reported = draw(reported_tasks(known, agent_id, "tasks" in b))
    register = AgentCall.Register(
        agent_id=agent_id,
        hostname=b("hostname", st.just("host"), STRINGS),
        address=b("address", st.just("127.0.0.1:1"), BAD_ADDRESSES),
        total=common_pb2.Resources(
            scalars=b(
                "total",
                st.just(total),
                weighted((2, ANY_RESOURCE_MAPS), (1, shares_of(total, GOOD_SHARES))),
            )
        ),
        attributes=b("attributes", st.sampled_from(({}, {"rack": "r1"})), BAD_ATTRIBUTES),
        isolation=b("how", st.sampled_from(ISOLATIONS), STRINGS),
        task_user=b("how", st.sampled_from(("", "nobody")), STRINGS),
        # A new agent cannot have tasks: it reports some only when that is what breaks.
        tasks=reported if agent_id or "tasks" in b else [],
    )
    return AgentCall(register=register)


@st.composite
def status_updates(draw: st.DrawFn, known: Known, agent_id: str) -> AgentCall.StatusUpdate:
    """An update of one of the agent's tasks, as the agent would send it, or not quite."""
    b = Breakage(draw, "task", "agent_id", "state", "update_id", "source", "latest")
    here = known.tasks_on(agent_id)
    elsewhere = [t for t in known.tasks if t.agent_id != agent_id]
    task = b("task", pick(here, NO_TASK), pick(elsewhere, NO_TASK))
    made_up = draw(st.integers(0, 5)) == 0  # of a task nobody has
    task_id = draw(weighted((2, FRESH_TASK_IDS), (1, BAD_IDS)))
    framework_id = draw(ids(known.frameworks, "f1"))
    status = common_pb2.TaskStatus(
        task_id=task_id if made_up else task.task_id,
        framework_id=framework_id if made_up else task.framework_id,
        agent_id=b(
            "agent_id",
            st.sampled_from(("", agent_id)),
            ids([a for a in known.agents if a != agent_id], "a1"),
        ),
        state=b("state", GOOD_STATES, BAD_STATES),
        message=draw(st.sampled_from(("", "exited"))),
        timestamp=draw(weighted((3, st.just(1.7e9)), (1, SECONDS))),
        update_id=b(
            "update_id",
            weighted((3, UPDATE_IDS), (1, pick(task.update_ids, "u1"))),
            weighted((2, st.just("")), (1, STRINGS)),
        ),
        source=b(
            "source",
            st.just(common_pb2.TaskStatus.SOURCE_AGENT),
            weighted((2, st.integers(0, 1)), (1, INT32)).map(Source),
        ),
    )
    if draw(st.booleans()):
        status.exit_code = draw(weighted((3, st.sampled_from((0, 1, 137))), (1, INT32)))
    status.reason = draw(REASONS)
    latest = b("latest", weighted((3, st.just(State(0))), (1, TERMINAL_STATES)), BAD_STATES)
    return AgentCall.StatusUpdate(status=status, latest_state=latest)


@st.composite
def usages(draw: st.DrawFn, known: Known, agent_id: str) -> list[agent_pb2.TaskUsage]:
    """What an agent measures its tasks use: its own tasks, or not quite."""
    here = known.tasks_on(agent_id, live=True)
    elsewhere = [t for t in known.tasks if t.agent_id != agent_id]
    found = []
    for _ in range(draw(st.integers(0, 3))):
        b = Breakage(draw, "task", "figures")
        task = b("task", pick(here, NO_TASK), pick(elsewhere, NO_TASK))
        figures = [b("figures", GOOD_FIGURES, BAD_FIGURES) for _ in range(4)]
        processes = draw(weighted((3, st.integers(0, 64)), (1, st.just(2**32 - 1))))
        found.append(
            agent_pb2.TaskUsage(
                framework_id=task.framework_id,
                task_id=task.task_id,
                cpus_used=figures[0],
                cpu_seconds=figures[1],
                mem_used_mb=figures[2],
                mem_peak_mb=figures[3],
                processes=processes,
            )
        )
    return found


@st.composite
def agent_calls(draw: st.DrawFn, known: Known, agent_id: str) -> AgentCall:
    """Any call a registered agent might send."""
    which = draw(st.integers(0, 9))
    if which < 6:
        return AgentCall(status_update=draw(status_updates(known, agent_id)))
    if which < 8:
        return AgentCall(heartbeat=AgentCall.Heartbeat(usage=draw(usages(known, agent_id))))
    if which < 9:
        return AgentCall()  # no call at all
    again = draw(registers(known))  # on a stream that registered already
    return again if again.HasField("register") else AgentCall()


# Bytes ------------------------------------------------------------------------------------


@st.composite
def garbage(draw: st.DrawFn, valid: bytes) -> bytes:
    """Bytes for a stream that may not be a message: random, or `valid` (a serialized
    message) cut short, with a byte changed, or with bytes after it."""
    how = draw(st.sampled_from(("random", "cut", "changed", "extended")))
    if how == "random" or len(valid) < 2:
        return draw(st.binary(min_size=1, max_size=64))
    if how == "cut":
        return valid[: draw(st.integers(1, len(valid) - 1))]
    if how == "changed":
        at = draw(st.integers(0, len(valid) - 1))
        return valid[:at] + bytes([valid[at] ^ draw(st.integers(1, 255))]) + valid[at + 1 :]
    return valid + draw(st.binary(min_size=1, max_size=16))
