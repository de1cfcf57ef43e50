"""Well-formed calls of a framework and an agent, as protobuf: for set-ups, probes and
barriers around the fuzzed ones (tests/support/wire_strategies.py draws those)."""

from __future__ import annotations

from mesolite.v1 import agent_pb2, common_pb2, scheduler_pb2

Call = scheduler_pb2.Call
AgentCall = agent_pb2.AgentCall


def subscribe(name: str, role: str = "*") -> Call:
    info = scheduler_pb2.FrameworkInfo(name=name, role=role)
    return Call(subscribe=Call.Subscribe(framework_info=info))


def register(total: dict[str, float]) -> AgentCall:
    return AgentCall(
        register=AgentCall.Register(
            hostname="host", address="127.0.0.1:1", total=common_pb2.Resources(scalars=total)
        )
    )


def running(task_id: str, framework_id: str, update_id: str) -> AgentCall:
    """The agent's TASK_RUNNING update of a task."""
    status = common_pb2.TaskStatus(
        task_id=task_id,
        framework_id=framework_id,
        state=common_pb2.TASK_RUNNING,
        update_id=update_id,
        source=common_pb2.TaskStatus.SOURCE_AGENT,
    )
    return AgentCall(status_update=AgentCall.StatusUpdate(status=status))


def launch(
    offer: scheduler_pb2.Offer,
    task_id: str,
    resources: dict[str, float],
    command: str = "sleep 30",
) -> Call:
    task = common_pb2.TaskInfo(
        task_id=task_id, command=command, resources=common_pb2.Resources(scalars=resources)
    )
    return Call(accept=Call.Accept(offer_ids=[offer.offer_id], tasks=[task]))
