"""The environment a task's command gets: not the agent's.

An agent's environment may hold its operator's secrets (cloud credentials,
tokens); a task sees only:

* from the agent's environment, the names in `PASSED` (where and how to run
  commands: PATH, locale, time zone) and those the operator adds
  (``--pass-env``); PATH defaults to `DEFAULT_PATH` when the agent has none;
* HOME set to the sandbox, USER and LOGNAME to the user the task runs as;
* the task's own variables, which override all of the above;
* MESOLITE_FRAMEWORK_ID, MESOLITE_TASK_ID, MESOLITE_SANDBOX and, when known,
  MESOLITE_AGENT_ID, set last, so a task cannot be misled about where and what
  it is; beside them the same under the names a Mesos command task reads
  (MESOS_FRAMEWORK_ID, MESOS_TASK_ID, MESOS_EXECUTOR_ID (the task's id, as Mesos'
  command executor), MESOS_SANDBOX, MESOS_DIRECTORY, MESOS_AGENT_ID and
  MESOS_SLAVE_ID), so a Mesos framework's tasks run unmodified.

This is Mesos' executor environment: ``--executor_environment_variables`` in
place of the agent's own, plus the task's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

PASSED = ("PATH", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "TZ")
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def task_environment(
    agent_env: Mapping[str, str],
    *,
    task_env: Mapping[str, str],
    sandbox: Path,
    user: str,
    framework_id: str,
    task_id: str,
    agent_id: str = "",
    pass_env: Iterable[str] = (),
) -> dict[str, str]:
    env = {"PATH": DEFAULT_PATH}
    for name in (*PASSED, *pass_env):
        if name in agent_env:
            env[name] = agent_env[name]
    env.update(HOME=str(sandbox), USER=user, LOGNAME=user)
    env.update(task_env)
    env["MESOLITE_FRAMEWORK_ID"] = framework_id
    env["MESOLITE_TASK_ID"] = task_id
    env["MESOLITE_SANDBOX"] = str(sandbox)
    if agent_id:
        env["MESOLITE_AGENT_ID"] = agent_id
    env.update(
        MESOS_FRAMEWORK_ID=framework_id,
        MESOS_TASK_ID=task_id,
        MESOS_EXECUTOR_ID=task_id,
        MESOS_SANDBOX=str(sandbox),
        MESOS_DIRECTORY=str(sandbox),
    )
    if agent_id:
        env["MESOS_AGENT_ID"] = env["MESOS_SLAVE_ID"] = agent_id
    return env
