"""The mesolite agent: registers with the master and runs the tasks it launches.

Run one with ``await Agent(AgentConfig(master, detect_resources(work_dir), work_dir)).run()``,
or as ``async with Agent(config) as agent:`` to run it in the background.
"""

from mesolite.agent.agent import Agent
from mesolite.agent.config import AgentConfig
from mesolite.agent.errors import AgentError, AgentRegistrationError
from mesolite.agent.gc_policy import GcConfig
from mesolite.agent.isolation import IsolationConfig, IsolationMode
from mesolite.agent.resources import detect_resources
from mesolite.agent.tasks import TaskRunner, TaskTransition
from mesolite.backoff import Backoff

__all__ = [
    "Agent",
    "AgentConfig",
    "AgentError",
    "AgentRegistrationError",
    "Backoff",
    "GcConfig",
    "IsolationConfig",
    "IsolationMode",
    "TaskRunner",
    "TaskTransition",
    "detect_resources",
]
