"""What every fuzz layer checks, how much it runs, and the figures it reports.

A fuzz test (tests/test_fuzz_*.py) feeds the master inputs drawn by
`tests/support/wire_strategies.py` and after each one checks:

- no crash: no handler raised anything but a documented refusal, and nothing was
  logged at error level (`error_logs`: the servicers log a bug they caught so);
- a refusal is one of `REFUSALS` (gRPC) or a 4xx (HTTP);
- the invariants hold (`MasterConfig.check_invariants`: `master.invariant_violations`);
- what the master keeps is what validation promises to let in (`kept_problems`);

and at the end that the master still serves a well-behaved client end to end.

Budget: CI runs a fixed number of examples per layer, derandomized, so every run
tries the same inputs and a failure is never a fluke of the draw;
`MESOLITE_FUZZ_EXAMPLES=50000` runs that many new random ones by hand (shrunk to a
small failing input if one fails). Each layer adds its figures to `FIGURES`,
printed at the end of the pytest run (tests/conftest.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
import unicodedata
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import grpc
import pytest
from hypothesis import HealthCheck, Phase, settings

from mesolite.master import validation
from mesolite.master.role_config import is_valid_role

if TYPE_CHECKING:
    from mesolite.master.master import Master

T = TypeVar("T")

# How the master may turn a stream down: bad input, an unknown id, not now, not yours,
# not without a principal.
REFUSALS = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
    }
)
# The rule `mesolite.resources` states for resource names.
RESOURCE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")
EXAMPLES_VARIABLE = "MESOLITE_FUZZ_EXAMPLES"
# The fuzzed master's ACLs: frameworks may register in these roles (and below a/ and
# eng/), and run their tasks as `svc`; the rest is denied (PERMISSION_DENIED); any agent
# may register.
ACLS = {
    "register_frameworks": [
        {"principals": {"type": "ANY"}, "roles": {"values": ["*", "a", "a/*", "eng", "eng/*"]}}
    ],
    "run_tasks": [{"principals": {"type": "ANY"}, "users": {"values": ["svc"]}}],
    "register_agents": [{"principals": {"type": "ANY"}}],
}


def fuzz_settings(ci_examples: int, *, shrink: bool = True) -> settings:
    """`ci_examples` derandomized examples, or $MESOLITE_FUZZ_EXAMPLES random ones.

    `shrink=False` where examples share a master (over the wire): a failing example
    replayed on a master in another state is another example, so it is not shrunk.
    """
    base = settings(
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
        print_blob=shrink,
        phases=list(Phase) if shrink else [Phase.explicit, Phase.generate],
        report_multiple_bugs=shrink,
    )
    wanted = os.environ.get(EXAMPLES_VARIABLE)
    if wanted:
        return settings(base, max_examples=int(wanted), derandomize=False)
    return settings(base, max_examples=ci_examples, derandomize=True)


# With authentication (in-process): team-a's frameworks in `*` and a's subtree, team-b's
# in `*` and eng's, anyone else's nowhere; agents only as agent-1 or agent-2.
AUTHENTICATED_ACLS = {
    "register_frameworks": [
        {"principals": {"values": ["team-a"]}, "roles": {"values": ["*", "a", "a/*"]}},
        {"principals": {"values": ["team-a"]}, "roles": {"type": "NONE"}},
        {"principals": {"values": ["team-b"]}, "roles": {"values": ["*", "eng", "eng/*"]}},
    ],
    "register_agents": [{"principals": {"values": ["agent-1", "agent-2"]}}],
}


def write_acls(directory: Path, acls: Mapping[str, Any] = ACLS) -> Path:
    path = directory / "acls.json"
    path.write_text(json.dumps(acls))
    return path


def fuzz_timeout(ci_seconds: float) -> pytest.MarkDecorator:
    """The test's timeout: `ci_seconds` (several times its run), none for a batch by hand."""
    return pytest.mark.timeout(0 if os.environ.get(EXAMPLES_VARIABLE) else ci_seconds)


def error_logs(logs: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Log events at error level or above (`log.exception` is one)."""
    return [e for e in logs if e.get("log_level") in ("error", "critical", "exception")]


def kept_problems(master: Master) -> list[str]:
    """What the master keeps that `master/validation.py` says it lets in never."""
    problems: list[str] = []

    def plain_id(what: str, value: str) -> None:
        if not validation.ID.fullmatch(value):
            problems.append(f"{what} {validation.clip(value)!r} is not a plain id")

    def text(what: str, value: str) -> None:
        # Free text an operator reads holds no control or format characters (newlines
        # forge log lines, escapes drive terminals, U+202E reverses what follows).
        if any(unicodedata.category(c) in ("Cc", "Cf") for c in value):
            problems.append(f"{what} {value!r} holds control characters")

    def resources(what: str, names: Sequence[str]) -> None:
        if len(names) > validation.MAX_RESOURCE_NAMES:
            problems.append(f"{what} has {len(names)} resource names")
        for name in names:
            if not RESOURCE_NAME.fullmatch(name) or len(name) > validation.MAX_RESOURCE_NAME:
                problems.append(f"{what} has resource name {validation.clip(name)!r}")

    for framework in master.frameworks.values():
        plain_id("framework id", framework.framework_id)
        if len(framework.info.name) > validation.MAX_NAME:
            problems.append(f"framework {framework.framework_id} has a name that long")
        text(f"framework {framework.framework_id}'s name", framework.info.name)
        if not is_valid_role(framework.info.role):
            problems.append(f"framework {framework.framework_id} has role {framework.info.role!r}")
        for task in (*framework.tasks.values(), *framework.completed):
            if validation.task_id_problem(task.spec.task_id):
                problems.append(f"task id {validation.clip(task.spec.task_id)!r} is not valid")
            text(f"task {task.spec.task_id}'s name", task.spec.name)
            resources(f"task {task.spec.task_id!r}", list(task.spec.resources))
    for agent in master.agents.values():
        plain_id("agent id", agent.agent_id)
        if len(agent.hostname) > validation.MAX_NAME:
            problems.append(f"agent {agent.agent_id} has a hostname that long")
        if max(len(agent.isolation), len(agent.task_user)) > validation.MAX_NAME:
            problems.append(f"agent {agent.agent_id} has an isolation or task user that long")
        for what, value in (
            ("hostname", agent.hostname),
            ("isolation", agent.isolation),
            ("task user", agent.task_user),
            *((f"attribute {k!r}", f"{k}={v}") for k, v in agent.attributes.items()),
        ):
            text(f"agent {agent.agent_id}'s {what}", value)
        if len(agent.attributes) > validation.MAX_ATTRIBUTES:
            problems.append(f"agent {agent.agent_id} has {len(agent.attributes)} attributes")
        resources(f"agent {agent.agent_id}", list(agent.total))
    return problems


@dataclass
class Figures:
    """What one fuzz layer ran: inputs sent to the master, and what became of them."""

    layer: str
    examples: int = 0
    inputs: int = 0
    refused: int = 0  # answered with an ERROR event, a refusal status or a 4xx
    seconds: float = 0.0

    def line(self) -> str:
        rate = self.inputs / self.seconds if self.seconds else 0.0
        return (
            f"fuzz {self.layer}: {self.inputs:,} inputs in {self.examples:,} examples, "
            f"{self.refused:,} refused, {self.seconds:.1f} s ({rate:,.0f}/s), 0 crashes"
        )


FIGURES: dict[str, Figures] = {}


@contextmanager
def started(loop: asyncio.Runner, resource: AbstractAsyncContextManager[T]) -> Iterator[T]:
    """`async with resource` for a synchronous test that runs `loop` a step at a time
    (hypothesis calls it once per example, and each example runs `loop.run(...)`)."""
    value = loop.run(resource.__aenter__())
    try:
        yield value
    except BaseException as e:
        if not loop.run(resource.__aexit__(type(e), e, e.__traceback__)):
            raise
    else:
        loop.run(resource.__aexit__(None, None, None))


@contextmanager
def figures(layer: str) -> Iterator[Figures]:
    """The figures of `layer`, timed while in the block; kept only if the block passes
    (a failing test reports its failure, not figures)."""
    found = Figures(layer)
    start = time.perf_counter()
    yield found
    found.seconds = time.perf_counter() - start
    FIGURES[layer] = found
