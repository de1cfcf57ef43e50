"""Plant known bugs one at a time and check that the tests catch each: the allocator's,
holes in authentication (TLS_TESTS), in isolation (ISOLATION_TESTS), in frameworks'
users (USER_TESTS) and in the agent's supervisor (SUPERVISOR_TESTS), and the operators'
tools (OPERATOR_BUGS: teardown and kill, history, sandbox GC, the CLI).

    python scripts/planted_bugs.py [--only NAME ...] [--tests FILE ...]

Each bug is a one-line change to the code (the allocator's ones issue 9 found
passing every test, and a few more; authentication's, issue 11; isolation's,
issue 12, run against the tests on this machine's cgroups). For each, the file
is patched, the given test files run (default: the allocator's fast unit
tests), and the file restored, whatever happens. A bug "caught" is one that
makes pytest fail; the script exits 1 if any bug went uncaught. Run it from the
project root with nothing else editing these files: it changes them in place
for the length of each run.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Bug:
    name: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...] = ()  # the tests that must catch it (default: all fast ones)


ISOLATION_TESTS = (
    "tests/test_isolation.py",
    "tests/test_isolation_cluster.py",
    "tests/test_task_usage.py",
)
FAST_TESTS = (
    "tests/test_allocator.py",
    "tests/test_role_tree.py",
    "tests/test_allocator_hierarchy.py",
)
TLS_TESTS = ("tests/test_tls.py", "tests/test_certs.py")
SUPERVISOR_TESTS = (
    "tests/test_agent_supervisor.py",
    "tests/test_agent_tasks.py",
    "tests/test_agent_recovery.py",
)
SPAWN_TESTS = ("tests/test_agent_spawn.py",)
SHIM_TESTS = ("tests/test_spawn_shim.py",)  # the C exec helper and the sh shim, both ways
USER_TESTS = (
    "tests/test_task_users.py",
    "tests/test_attack_review.py::"
    "test_a_task_of_one_team_cannot_read_another_teams_output_or_environment",
    "tests/test_registry.py",
)
PAPER_TESTS = ("tests/test_ceei.py", "tests/test_policy_properties.py")
# Weight vectors (issue 14): the unit tests of each layer, the property tests and
# the end-to-end test over real gRPC.
WEIGHT_TESTS = (
    "tests/test_policies.py",
    "tests/test_role_tree.py",
    "tests/test_fair_share.py",
    "tests/test_roles_config.py",
    "tests/test_fairness_properties.py",
    "tests/test_read_model.py",
    "tests/test_roles_cluster.py",
)

BUGS = [
    Bug(
        "nested limit takes max of the headroom",
        "master/role_tree.py",
        "room[name] = min(cap, room.get(name, cap))",
        "room[name] = max(cap, room.get(name, cap))",
    ),
    Bug(
        "guarantee tier looks at CPUs only",
        "master/role_tree.py",
        "below = not role.allocation.contains(role.guarantee)",
        'below = role.allocation.get_amount("cpus") < role.guarantee.get_amount("cpus")',
    ),
    Bug(
        "a child ignores its parent's headroom",
        "master/role_tree.py",
        "room = _narrow(headroom, child.limit, child.allocation)",
        "room = _narrow(None, child.limit, child.allocation)",
    ),
    Bug(
        "remove_agent leaves the filter index behind",
        "master/allocator.py",
        "            self._frameworks[framework_id].filtered_agents.discard(agent_id)\n"
        "        for framework_id in agent.unfit:",
        "            pass\n        for framework_id in agent.unfit:",
    ),
    Bug(
        "framework ties broken by id, not subscription order",
        "master/role_tree.py",
        "return (share, framework.seq, framework.framework_id)",
        "return (share, 0, framework.framework_id)",
    ),
    Bug(
        "sibling role ties broken by name, not creation order",
        "master/role_tree.py",
        "            role.seq,\n            role.name,",
        "            0,\n            role.name,",
    ),
    Bug(
        "a role at its limit in what it limits gets nothing (the old skip)",
        "master/role_tree.py",
        'if room.get("cpus") == 0 and room.get("mem") == 0:',
        "if room and not any(room.values()):",
    ),
    Bug(
        "weights ignored in the role order",
        "master/role_tree.py",
        "            self._weighted(role),",
        "            self.policy.share(role.allocation, self._total),",
    ),
    Bug(
        "the group of a role's own frameworks is ranked by its biggest framework",
        "master/role_tree.py",
        "return (1, self.policy.share(group.allocation, self._total), group.seq, _GROUP)",
        "return (1, max((k[0] for k in group.order), default=0.0), group.seq, _GROUP)",
    ),
    Bug(
        "a filter blocks even a bigger offer",
        "master/allocator.py",
        "elif refused.resources.contains(free):",
        "else:",
    ),
    Bug(
        "expired filters still apply",
        "master/allocator.py",
        "if refused.expires_at <= now:",
        "if refused.expires_at <= now - 1e9:",
    ),
    Bug(
        "revive keeps the filters",
        "master/allocator.py",
        "        framework.suppressed = False\n        self._clear_filters(framework)",
        "        framework.suppressed = False",
    ),
    Bug(
        "a weight change is not re-sorted",
        "master/role_tree.py",
        "        self._reposition_role(role)\n\n    def unconfigure_role",
        "        pass\n\n    def unconfigure_role",
    ),
    # Weight vectors (issue 14).
    Bug(
        "weight vector: DRF divides a share by another resource's weight",
        "master/policies/drf.py",
        "fraction = divided(amount / available, resource_weights.get(name, weight))",
        'fraction = divided(amount / available, resource_weights.get({"cpus": "mem"}'
        '.get(name, "cpus"), weight))',
        WEIGHT_TESTS,
    ),
    Bug(
        "weight vector: a share is multiplied by its weight",
        "master/policies/base.py",
        "return fraction / weight if weight > 0 else INFINITE",
        "return fraction * weight if weight > 0 else INFINITE",
        WEIGHT_TESTS,
    ),
    Bug(
        "weight vector: DRF weighs unnamed resources 0",
        "master/policies/drf.py",
        "fraction = divided(amount / available, resource_weights.get(name, weight))",
        "fraction = divided(amount / available, resource_weights.get(name, 0.0))",
        WEIGHT_TESTS,
    ),
    Bug(
        "weight vector: asset fairness weighs unnamed resources 0",
        "master/policies/asset.py",
        "divided(amount / cluster[name], resource_weights.get(name, weight))",
        "divided(amount / cluster[name], resource_weights.get(name, 0.0))",
        WEIGHT_TESTS,
    ),
    Bug(
        "weight vector: slots weigh unnamed resources 1 whatever the weight",
        "master/policies/slots.py",
        "divided(needed / capacity, resource_weights.get(name, weight))",
        "divided(needed / capacity, resource_weights.get(name, 1.0))",
        WEIGHT_TESTS,
    ),
    Bug(
        "weight vector: ignored, the scalar weight only",
        "master/policies/base.py",
        "    if resource_weights:\n",
        "    if False:\n",
        WEIGHT_TESTS,
    ),
    Bug(
        "weight vector: not kept by the role tree",
        "master/role_tree.py",
        "role.resource_weights = dict(resource_weights) if resource_weights else None",
        "role.resource_weights = None",
        WEIGHT_TESTS,
    ),
    Bug(
        "weight vector: the roles file's table leaves unnamed resources at 0",
        "master/role_config.py",
        "        return 1.0, MappingProxyType(weights)",
        "        return 0.0, MappingProxyType(weights)",
        WEIGHT_TESTS,
    ),
    Bug(
        "weight vector: the master does not pass the roles file's table on",
        "master/role_settings.py",
        "spec.weight, guarantee, limit, dict(spec.resource_weights) or None",
        "spec.weight, guarantee, limit, None",
        WEIGHT_TESTS,
    ),
    Bug(
        "weight vector: fair shares ignore it",
        "master/fair_share.py",
        "        if vectors:\n",
        "        if False:\n",
        WEIGHT_TESTS,
    ),
    Bug(
        "weight vector: fair shares use another resource's weight",
        "master/fair_share.py",
        "[i._resource_parts.get(name, i._weight_parts) for i in inputs]",
        '[i._resource_parts.get({"cpus": "mem"}.get(name, "cpus"), i._weight_parts)'
        " for i in inputs]",
        WEIGHT_TESTS,
    ),
    Bug(
        "weight vector: fair shares weigh unnamed resources 0",
        "master/fair_share.py",
        "[i._resource_parts.get(name, i._weight_parts) for i in inputs]",
        "[i._resource_parts.get(name, (0, 0)) for i in inputs]",
        WEIGHT_TESTS,
    ),
    Bug(
        "weight vector: /state leaves it out",
        "master/read_model.py",
        "                resource_weights=tree.role_resource_weights(path),",
        "                resource_weights=None,",
        WEIGHT_TESTS,
    ),
    Bug(
        "weight vector: the exact reference multiplies by the weight",
        "mesolite/lab/drf_reference.py",
        "return {r: share / named.get(r, weight) for r, share in unit.items()}",
        "return {r: share * named.get(r, weight) for r, share in unit.items()}",
        ("tests/test_drf_reference.py", "tests/test_roles_cluster.py"),
    ),
    # CEEI and the properties table (issue 14).
    Bug(
        "CEEI: incomes ignored",
        "mesolite/lab/ceei.py",
        "    budget = budget / budget.sum()",
        "    budget = np.full(len(budget), 1 / len(budget))",
        PAPER_TESTS,
    ),
    Bug(
        "properties: sharing incentive measured on the whole cluster",
        "mesolite/lab/fairness_properties.py",
        "alone = min(Fraction(case.capacity[r], n * x) for r, x in d.items() if x)",
        "alone = min(Fraction(case.capacity[r], x) for r, x in d.items() if x)",
        PAPER_TESTS,
    ),
    Bug(
        "properties: envy counted only beyond a whole task",
        "mesolite/lab/fairness_properties.py",
        "if envied - allowance > out.tasks[i]:",
        "if envied - allowance > out.tasks[i] + 1:",
        PAPER_TESTS,
    ),
    # Isolation (issue 12): each against the tests on this machine's cgroups.
    Bug(
        "the command does not join its cgroup (a wrapper's: where the supervisor cannot spawn)",
        "agent/isolation.py",
        'args += ["--cgroup", str(path)]',
        "pass",
        ISOLATION_TESTS + SPAWN_TESTS,
    ),
    Bug(
        "a cgroup kill finds no process in the cgroup",
        "agent/_task_wrapper.py",
        "        pids = cgroup_pids(cgroups)\n        if not pids:\n            return True",
        "        pids: set[int] = set()\n        if not pids:\n            return True",
        ISOLATION_TESTS,
    ),
    Bug(
        "an OOM kill is not told from any other failure",
        "agent/isolation.py",
        "        if stats.oom_kills:",
        "        if stats.oom_kills > 1:",
        ISOLATION_TESTS,
    ),
    Bug(
        "the pids limit is not written",
        "agent/_cgroups.py",
        '        (dirs["pids"] / "pids.max").write_text(str(limits.pids))',
        "        pass",
        ISOLATION_TESTS,
    ),
    Bug(
        "the CPU quota is not written",
        "agent/_cgroups.py",
        '        (dirs["cpu"] / "cpu.cfs_quota_us").write_text(str(limits.cfs_quota_us))',
        "        pass",
        ISOLATION_TESTS,
    ),
    Bug(
        "a task inherits the agent's environment",
        "agent/_task_env.py",
        'env = {"PATH": DEFAULT_PATH}',
        'env = {"PATH": DEFAULT_PATH, **agent_env}',
        ISOLATION_TESTS,
    ),
    Bug(
        "the agent's records are readable by tasks",
        "agent/_task_records.py",
        "    os.chmod(meta, 0o700)",
        "    os.chmod(meta, 0o755)",
        ISOLATION_TESTS,
    ),
    Bug(
        "tasks run as root (a wrapper's: where the supervisor cannot spawn)",
        "agent/isolation.py",
        'args += ["--user", self.user.wrapper_arg()]',
        "pass",
        ISOLATION_TESTS + SPAWN_TESTS,
    ),
    Bug(
        "a restarted agent leaves cgroups no task owns",
        "agent/tasks.py",
        "orphans = await asyncio.to_thread(self.isolator.remove_orphans, live)",
        "orphans = 0",
        ISOLATION_TESTS,
    ),
    Bug(
        "the fallback's wrapper is no subreaper",
        "agent/isolation.py",
        'args += ["--subreaper", "--rlimit"',
        'args += ["--rlimit"',
        ISOLATION_TESTS,
    ),
    Bug(
        "the reason is lost on the wire",
        "mesolite/convert.py",
        "        msg.reason = _REASONS[status.reason]  # type: ignore[assignment]",
        "        pass",
        ISOLATION_TESTS,
    ),
    Bug(
        "an agent's usage figures land on another agent's tasks",
        "master/agents.py",
        "            for key, task in agent.tasks.items():\n"
        "                task.usage = measured.get(key)",
        "            for key, task in (\n"
        "                kt for a in self.agents.values() for kt in a.tasks.items()\n"
        "            ):\n"
        "                task.usage = measured.get(key, task.usage)",
        ISOLATION_TESTS,
    ),
    # The supervisor (issue 15): each a way to lose a task's status or to let another
    # user drive the supervisor.
    Bug(
        "supervisor: serves any user who reaches its socket",
        "agent/_supervisor.py",
        "        if uid != os.geteuid():\n            self.say(",
        "        if False:\n            self.say(",
        SUPERVISOR_TESTS,
    ),
    Bug(
        "supervisor: a wrapper not yet on disk is not looked for in its list",
        "agent/_task_process.py",
        "            listed = self._supervisor.wrapper_of(t.records)",
        "            listed = None",
        SUPERVISOR_TESTS,
    ),
    Bug(
        "supervisor: its death leaves the agent not waiting for running tasks",
        "agent/_task_process.py",
        "nobody's child now\n            await wait_for_exit(spawned.pid, spawned.start_time)",
        "nobody's child now\n            pass",
        SUPERVISOR_TESTS,
    ),
    Bug(
        "supervisor: runs in the agent's own cgroup",
        "agent/tasks.py",
        "self._work_dir / SUPERVISOR_DIR, self.isolator.supervisor_cgroup",
        "self._work_dir / SUPERVISOR_DIR, list",
        SUPERVISOR_TESTS,
    ),
    Bug(
        "supervisor: an agent restarted after SIGKILL starts a new supervisor",
        "agent/tasks.py",
        "            await self._supervisor.connect(start=False)",
        "            pass",
        SUPERVISOR_TESTS,
    ),
    # Commands the supervisor spawns itself (issue 15): each a way to lose a real exit
    # status, or a guarantee of the container.
    Bug(
        "spawn: the keeper does not record the ends of what a dead supervisor left",
        "agent/_supervisor.py",
        "        if server_alive:\n            continue",
        "        if True:\n            continue",
        SPAWN_TESTS,
    ),
    Bug(
        "spawn: its supervisor's death leaves the agent not waiting for a command",
        "agent/_task_process.py",
        "to the log\n            await wait_for_exit(spawned.pid, spawned.start_time)",
        "to the log\n            pass",
        SPAWN_TESTS,
    ),
    Bug(
        "spawn: ends are not written to the exit log",
        "agent/_supervisor.py",
        "            self._exits.add(record, durable=True)",
        "            pass",
        SPAWN_TESTS,
    ),
    Bug(
        "spawn: the exit log's group commit does not fsync",
        "agent/_exit_log.py",
        "        if durable:\n            os.fsync(self._fd)",
        "        if False:\n            os.fsync(self._fd)",
        SPAWN_TESTS,
    ),
    Bug(
        "spawn: a recovered command's end is not read from the exit log",
        "agent/_task_process.py",
        "            end = (await self._exit_log.current()).end_of(t.pid, t.start_time)",
        "            end = None",
        SPAWN_TESTS,
    ),
    Bug(
        "spawn: a command whose pid was not checkpointed is not looked for in the log",
        "agent/_task_process.py",
        "            spawned = (await self._exit_log.current(fresh=True)).spawned.get(t.run_id)",
        "            spawned = None",
        SPAWN_TESTS,
    ),
    Bug(
        "spawn: the shim says the command is ready before it is in its cgroup",
        "agent/_supervisor.py",
        """    'while [ "$1" != -- ]; do echo 0 > "$1/cgroup.procs" || '""",
        """    'echo "$$" >&3; while [ "$1" != -- ]; do echo 0 > "$1/cgroup.procs" || '""",
        SPAWN_TESTS,
    ),
    Bug(
        "spawn: the shim stays the command's parent (two processes in its pids limit)",
        "agent/_supervisor.py",
        """    'echo "$$" >&3; exec "$@" 3>&-'""",
        """    'echo "$$" >&3; "$@" 3>&-'""",
        ("tests/test_isolation.py",),
    ),
    Bug(
        "spawn: a spawned command inherits the signals Python ignores",
        "agent/_supervisor.py",
        "                setsigdef=(signal.SIGPIPE, signal.SIGXFSZ),",
        "                setsigdef=(),",
        SPAWN_TESTS,
    ),
    Bug(
        "spawn: the agent's descriptors leak into spawned commands",
        "agent/_supervisor.py",
        "                    os.set_inheritable(fd, False)",
        "                    pass",
        SPAWN_TESTS,
    ),
    Bug(
        "spawn: a spawned command is not put into its cgroup",
        "agent/_supervisor.py",
        'argv = [SHELL, "-c", SHIM, "mesolite-task", *self.cgroups, "--"]',
        'argv = [SHELL, "-c", SHIM, "mesolite-task", "--"]',
        ISOLATION_TESTS,
    ),
    Bug(
        "spawn: a spawned command keeps the supervisor's user",
        "agent/_supervisor.py",
        "        if self.user is not None:\n            uid, gid, groups = self.user",
        "        if False:\n            uid, gid, groups = self.user",
        ISOLATION_TESTS,
    ),
    # The C exec helper (agent/spawn_shim.c, issue 15): the sh shim and setpriv in one.
    Bug(
        "spawn shim (C): the first cgroup is skipped",
        "agent/spawn_shim.c",
        '    for (; i < argc && strcmp(argv[i], "--") != 0; i++) join(argv[i]);',
        '    for (; i < argc && strcmp(argv[i], "--") != 0; i++) if (i > 1) join(argv[i]);',
        SHIM_TESTS,
    ),
    Bug(
        "spawn shim (C): says it is ready before it has joined its cgroups",
        "agent/spawn_shim.c",
        "    put_number(pid_text, 0, sizeof pid_text, (unsigned long)getpid());\n",
        "    put_number(pid_text, 0, sizeof pid_text, (unsigned long)getpid());\n"
        "    write_all(REPORT_FD, pid_text, strlen(pid_text));\n"
        '    write_all(REPORT_FD, "\\n", 1);\n',
        SHIM_TESTS,
    ),
    Bug(
        "spawn shim (C): becomes the uid before it sets the groups and the gid",
        "agent/spawn_shim.c",
        "    if (setgroups(count, groups) != 0)",
        '    if (setuid((uid_t)uid) != 0) fail("cannot set the uid ", uid_text, errno);\n'
        "    if (setgroups(count, groups) != 0)",
        SHIM_TESTS,
    ),
    Bug(
        "spawn shim (C): why it cannot confine a command is not said",
        "agent/spawn_shim.c",
        "    write_all(REPORT_FD, line, at);",
        "    write_all(REPORT_FD, line, 0);",
        SHIM_TESTS + SPAWN_TESTS,
    ),
    Bug(
        "spawn (C helper): the task's user is not passed to the helper",
        "agent/_supervisor.py",
        'return [helper, *self.cgroups, "--", *user, "--", *self.argv]',
        'return [helper, *self.cgroups, "--", "--", *self.argv]',
        SHIM_TESTS,
    ),
    Bug(
        "spawn (C helper): the task's supplementary groups are dropped",
        "agent/_supervisor.py",
        'user = [str(uid), str(gid), ",".join(map(str, groups))]',
        'user = [str(uid), str(gid), ""]',
        SHIM_TESTS,
    ),
    Bug(
        "spawn (C helper): the helper is used where it is absent",
        "agent/_supervisor.py",
        'usable = named != "sh" and os.path.isfile(path) and os.access(path, os.X_OK)',
        'usable = named != "sh"',
        SHIM_TESTS,
    ),
    # Batches on the agent's stream (issue 15): asked for, read, and sent only once told.
    Bug(
        "agent: batched events from the master are dropped",
        "agent/_wire.py",
        "        return [event_from_proto(event) for event in msg.batch.events]",
        "        return []",
        ("tests/test_agent_gateway.py",),
    ),
    Bug(
        "agent: sends batches to a master that did not say it reads them",
        "agent/agent.py",
        "            if not reads_batches or len(calls) == 1:",
        "            if len(calls) == 1:",
        ("tests/test_agent_gateway.py",),
    ),
    Bug(
        "stream writer: a busy stream does not linger",
        "mesolite/stream_writer.py",
        "            if linger > 0:\n                await self._linger(",
        "            if False:\n                await self._linger(",
        ("tests/test_stream_writer.py",),
    ),
    # Authentication (issue 11): each a way in without a principal, or a wrong principal.
    Bug(
        "the gRPC port does not require client certificates",
        "mesolite/grpc_utils.py",
        "require_client_auth=client_cert,",
        "require_client_auth=False,",
        TLS_TESTS,
    ),
    Bug(
        "HTTPS does not ask for client certificates",
        "mesolite/tls.py",
        "ssl.CERT_REQUIRED if require_client_cert else ssl.CERT_OPTIONAL",
        "ssl.CERT_REQUIRED if require_client_cert else ssl.CERT_NONE",
        TLS_TESTS,
    ),
    Bug(
        "HTTP routes without the authentication middleware",
        "master/http.py",
        "            authn.middleware(),\n",
        "",
        TLS_TESTS,
    ),
    Bug(
        "any bearer token of the right length is accepted",
        "mesolite/credentials.py",
        "if hmac.compare_digest(presented, known):",
        "if len(presented) == len(known):",
        TLS_TESTS,
    ),
    Bug(
        "the servicer does not pass the principal to the core",
        "master/servicers.py",
        "self._master.subscribe(info, outbox, principal=principal)",
        "self._master.subscribe(info, outbox)",
        TLS_TESTS,
    ),
    Bug(
        "an ACL refusal is not told to the client as PERMISSION_DENIED",
        "master/servicers.py",
        "    Refusal.FORBIDDEN: grpc.StatusCode.PERMISSION_DENIED,\n",
        "",
        TLS_TESTS,
    ),
    Bug(
        "the HTTP ACLs judge every request as anonymous",
        "master/http.py",
        "acl_guard(master, authn.request_principal)",
        "acl_guard(master)",
        TLS_TESTS,
    ),
    Bug(
        "the sandbox server answers any principal of the CA",
        "agent/sandbox_http.py",
        "if principal not in readers:",
        "if principal is None:",
        TLS_TESTS,
    ),
    Bug(
        "the sandbox proxy reads agents over plain HTTP",
        "master/ui_routes.py",
        'url = url.with_scheme("https")',
        "pass",
        TLS_TESTS,
    ),
    Bug(
        "an HTTPS client does not verify the server",
        "mesolite/tls.py",
        "            if self.cert is not None and self.key is not None:\n"
        "                context.load_cert_chain",
        "            context.check_hostname = False\n"
        "            context.verify_mode = ssl.CERT_NONE\n"
        "            if self.cert is not None and self.key is not None:\n"
        "                context.load_cert_chain",
        TLS_TESTS,
    ),
    Bug(
        "a non-loopback address without TLS is allowed",
        "mesolite/tls.py",
        "    if tls or is_loopback(host):\n        return",
        "    if True:\n        return",
        TLS_TESTS,
    ),
    Bug(
        "private keys are written readable by all",
        "mesolite/certs.py",
        "os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600",
        "os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644",
        TLS_TESTS,
    ),
    # The agent's task log (issue 15, the agent's CPU per task): each a way to lose or
    # misread a checkpoint, or a figure of the container.
    Bug(
        "task log: a durable checkpoint is not fsynced",
        "agent/_task_log.py",
        "        if durable:\n            os.fsync(fd)",
        "        if False:\n            os.fsync(fd)",
        ("tests/test_task_log.py",),
    ),
    Bug(
        "task log: a task's first line is taken for its checkpoint",
        "agent/_task_log.py",
        '        latest[key] = line + b"\\n"',
        '        latest.setdefault(key, line + b"\\n")',
        ("tests/test_task_log.py",),
    ),
    Bug(
        "task log: the next line is glued to a torn one",
        "agent/_task_log.py",
        "        if damaged:\n            log.warning(",
        "        if False:\n            log.warning(",
        ("tests/test_task_log.py",),
    ),
    Bug(
        "task log: compaction keeps the tasks no longer needed, not the live ones",
        "agent/_task_log.py",
        "for key, line in self._latest.items() if key in keep}",
        "for key, line in self._latest.items() if key not in keep}",
        ("tests/test_task_log.py",),
    ),
    Bug(
        "task log: compaction while a recovery has not said what it keeps",
        "agent/_task_log.py",
        "        if not self.may_compact:\n            return list(",
        "        if False:\n            return list(",
        ("tests/test_task_log.py",),
    ),
    Bug(
        "task log: the STARTING checkpoint is not fsynced before the command is spawned",
        "agent/_task_process.py",
        "        await self._checkpoints.checkpoint(t)\n"
        "        try:\n            if t.kill_requested:",
        "        await self._checkpoints.checkpoint(t, durable=False)\n"
        "        try:\n            if t.kill_requested:",
        SPAWN_TESTS,
    ),
    Bug(
        "task log: an older agent's checkpoints are not moved into it",
        "agent/tasks.py",
        "            moved.append((records, self._checkpoints.write(logged[key], durable=True)))",
        "            pass",
        SUPERVISOR_TESTS,
    ),
    Bug(
        "task log: an older agent's checkpoints are left behind once moved",
        "agent/tasks.py",
        "        (directory / CHECKPOINT_FILE).unlink(missing_ok=True)",
        "        pass",
        SUPERVISOR_TESTS,
    ),
    Bug(
        "a sandbox's age counts from its launch, not its task's end",
        "agent/_task_process.py",
        "            os.utime(t.sandbox, follow_symlinks=False)",
        "            pass",
        ("tests/test_agent_tasks.py",),
    ),
    Bug(
        "a run's end reads no OOM kill from its cgroup (v1)",
        "agent/_cgroups.py",
        '            oom = _keyed(memory / "memory.oom_control").get("oom_kill", 0) '
        "if memory else 0",
        "            oom = 0",
        ISOLATION_TESTS,
    ),
    Bug(
        "the agent's task log is readable by tasks",
        "agent/_task_log.py",
        "PRIVATE_MODE = 0o600",
        "PRIVATE_MODE = 0o644",
        ISOLATION_TESTS,
    ),
    # A user per framework (issue 12's follow-up): each a way for one framework's tasks
    # to reach another's, or for a framework to run as a user nobody allowed.
    Bug(
        "user: the agent ignores the framework's user",
        "agent/isolation.py",
        "if self.user is None or not framework_user:",
        "if True:",
        USER_TESTS,
    ),
    Bug(
        "user: sandboxes are 0755",
        "agent/_task_records.py",
        "SANDBOX_MODE = 0o700",
        "SANDBOX_MODE = 0o755",
        USER_TESTS,
    ),
    Bug(
        "user: the sandboxes' parents can be listed",
        "agent/_task_records.py",
        "SANDBOX_PARENT_MODE = 0o711",
        "SANDBOX_PARENT_MODE = 0o755",
        USER_TESTS,
    ),
    Bug(
        "user: the work dir can be listed",
        "agent/_checkpoint.py",
        "WORK_DIR_MODE = 0o711",
        "WORK_DIR_MODE = 0o755",
        USER_TESTS,
    ),
    Bug(
        "user: the journal is readable by tasks",
        "agent/_journal.py",
        "PRIVATE_MODE = 0o600",
        "PRIVATE_MODE = 0o644",
        USER_TESTS,
    ),
    Bug(
        "user: run_tasks is not checked at SUBSCRIBE",
        "master/frameworks.py",
        "if not self.may_run_tasks_as(principal, info.user):",
        "if False:",
        USER_TESTS,
    ),
    Bug(
        "user: ANY in run_tasks covers root",
        "master/acl.py",
        "named_only = action is Action.RUN_TASKS and obj == ROOT",
        "named_only = False",
        USER_TESTS,
    ),
    Bug(
        "user: another name for uid 0 is taken",
        "agent/isolation.py",
        'if user.uid == 0 and framework_user != "root":',
        "if False:",
        USER_TESTS,
    ),
    Bug(
        "user: a user missing on the agent runs the task as the task user",
        "agent/isolation.py",
        "        except (KeyError, ValueError):  # ValueError: a NUL (the master lets none "
        "through)\n            raise TaskUserError(",
        "        except (KeyError, ValueError):\n            return self.user\n"
        "            raise TaskUserError(",
        USER_TESTS,
    ),
    Bug(
        "user: not validated",
        "master/validation.py",
        "return user_problem(info.user) if info.user else None",
        "return None",
        USER_TESTS,
    ),
    Bug(
        "user: the SDK does not send it",
        "framework_sdk/_framework.py",
        'user=self.user or "",',
        'user="",',
        USER_TESTS,
    ),
    Bug(
        "user: launches do not carry it",
        "master/offers.py",
        "msg.LaunchTask(framework_id, spec, framework.info.user)",
        "msg.LaunchTask(framework_id, spec)",
        USER_TESTS,
    ),
    Bug(
        "user: it may change on re-subscription",
        "master/frameworks.py",
        "if framework.info.user != info.user:",
        "if False:",
        USER_TESTS,
    ),
    Bug(
        "user: not kept in the registry",
        "master/registry.py",
        "                    entry.principal,\n                    entry.user,",
        '                    entry.principal,\n                    "",',
        USER_TESTS,
    ),
    Bug(
        "user: not checkpointed with the task",
        "agent/_task_records.py",
        '"user": t.user,',
        '"user": "",',
        USER_TESTS,
    ),
    Bug(
        "user: not recovered from the checkpoint",
        "agent/_task_records.py",
        'user=_str(record.get("user", "")),',
        'user="",',
        USER_TESTS,
    ),
    Bug(
        "user: new ACLs leave a framework whose user they no longer allow",
        "master/core.py",
        ") and self.may_run_tasks_as(framework.principal, framework.info.user)",
        ") and True",
        USER_TESTS,
    ),
]

# Operators (issue 13): teardown and kill, the history, sandbox GC, the CLI.
OPERATOR_BUGS = [
    Bug(
        "operator routes checked as view_state",
        "master/operator_api.py",
        'Route(TEARDOWN_PATH, _teardown, Action.TEARDOWN_FRAMEWORKS, method="POST")',
        'Route(TEARDOWN_PATH, _teardown, Action.VIEW_STATE, method="POST")',
        ("tests/test_operator_api.py::test_only_who_the_acls_allow_may_act",),
    ),
    Bug(
        "ACL object = the caller, not the framework's principal",
        "master/http_access.py",
        "obj = framework.principal if framework is not None else None",
        "obj = who",
        ("tests/test_operator_api.py::test_only_who_the_acls_allow_may_act",),
    ),
    Bug(
        "operator refusals not counted",
        "master/http.py",
        "            count_refusals,  # outermost",
        "            # count_refusals,  # outermost",
        (
            "tests/test_operator_api.py::test_kill_and_teardown_from_the_command_line_leave_a_history",
        ),
    ),
    Bug(
        "refused SUBSCRIBE not counted",
        "master/servicers.py",
        '                self._master.metrics.call_rejected("subscribe")\n',
        "",
        ("tests/test_operator_api.py::test_a_refused_subscribe_is_counted",),
    ),
    Bug(
        "form posts accepted (no JSON content type check)",
        "master/operator_api.py",
        'if request.content_type != "application/json":',
        "if False:",
        (
            "tests/test_operator_api.py::test_kill_and_teardown_from_the_command_line_leave_a_history",
        ),
    ),
    Bug(
        "teardown of a framework being torn down accepted",
        "master/operator.py",
        "        if framework.removing:\n",
        "        if False:\n",
        ("tests/test_history.py::test_operator_refusals_say_why_and_change_nothing",),
    ),
    Bug(
        "kill sent to a disconnected agent's task",
        "master/operator.py",
        "if agent is None or agent.outbox is None:",
        "if agent is None:",
        ("tests/test_history.py::test_operator_refusals_say_why_and_change_nothing",),
    ),
    Bug(
        "removed frameworks not kept in history",
        "master/frameworks.py",
        "            self._keep_completed(framework)\n",
        "",
        (
            "tests/test_history.py",
            "tests/test_operator_api.py::test_kill_and_teardown_from_the_command_line_leave_a_history",
        ),
    ),
    Bug(
        "completed frameworks unbounded",
        "master/frameworks.py",
        "while len(self.completed_frameworks) > self.config.max_completed_frameworks:",
        "while False:",
        ("tests/test_history.py::test_history_is_bounded_as_mesos_bounds_it",),
    ),
    Bug(
        "/state holds only the newest 50 ended tasks",
        "master/http.py",
        "SnapshotDocument(functools.partial(snapshot, None))",
        "SnapshotDocument(functools.partial(snapshot))",
        (
            "tests/test_history.py::test_get_state_holds_every_ended_task_kept_and_the_page_the_newest",
        ),
    ),
    Bug(
        "completed frameworks' tasks left out of the snapshot",
        "master/read_model.py",
        "[*master.frameworks.values(), *master.completed_frameworks.values()], ended_tasks",
        "[*master.frameworks.values()], ended_tasks",
        (
            "tests/test_history.py",
            "tests/test_operator_api.py::test_kill_and_teardown_from_the_command_line_leave_a_history",
        ),
    ),
    Bug(
        "an oversized operator call answered 500 (the 413 built wrong)",
        "master/operator_api.py",
        "        MAX_BODY,\n        size,\n        text=",
        "        text=",
        (
            "tests/test_operator_api.py::test_kill_and_teardown_from_the_command_line_leave_a_history",
            "tests/test_fuzz_http.py",
        ),
    ),
    Bug(
        "gc plan ignores live tasks",
        "agent/gc_policy.py",
        "        if sandbox.key in live:\n            continue\n",
        "",
        ("tests/test_sandbox_gc.py",),
    ),
    Bug(
        "allowed age not scaled by disk usage",
        "agent/gc_policy.py",
        "    return config.delay * room",
        "    return config.delay",
        ("tests/test_sandbox_gc.py",),
    ),
    Bug(
        "no liveness re-check before removal",
        "agent/_sandbox_gc.py",
        "if sandbox.key in self._live():  # launched again since the scan",
        "if False:  # planted: no re-check",
        ("tests/test_sandbox_gc.py::test_a_task_launched_again_since_the_scan_keeps_its_sandbox",),
    ),
    Bug(
        "unacknowledged ends not live",
        "agent/tasks.py",
        "return set(self._tasks) | set(self._ended) | self._finishing",
        "return set(self._tasks) | self._finishing",
        ("tests/test_sandbox_gc.py::test_a_task_whose_end_is_not_acknowledged_keeps_its_sandbox",),
    ),
    Bug(
        "agent never starts its gc",
        "agent/agent.py",
        'gc = asyncio.create_task(self._gc.run(), name="mesolite-agent-gc")',
        "gc = None",
        ("tests/test_sandbox_gc.py",),
    ),
    Bug(
        "--help without defaults",
        "mesolite/cli/_args.py",
        'kwargs.setdefault("formatter_class", _HelpFormatter)',
        "pass",
        ("tests/test_cli_polish.py::test_help_shows_every_default",),
    ),
    Bug(
        "tasks view shows the host name only",
        "mesolite/views.py",
        '            t.agent_id,\n            hosts.get(t.agent_id, "-"),\n',
        '            hosts.get(t.agent_id, t.agent_id),\n            "",\n',
        ("tests/test_cli_polish.py::test_two_agents_on_one_host_are_told_apart",),
    ),
    Bug(
        "no closed-pipe handling",
        "mesolite/cli/_main.py",
        "    except BrokenPipeError:",
        "    except ZeroDivisionError:",
        ("tests/test_cli_polish.py::test_a_closed_pipe_ends_the_command_quietly",),
    ),
    Bug(
        "no Ctrl-C handling",
        "mesolite/cli/_main.py",
        "    except KeyboardInterrupt:\n        print(file=sys.stderr)",
        "    except ZeroDivisionError:\n        print(file=sys.stderr)",
        ("tests/test_cli_polish.py::test_ctrl_c_ends_the_command_quietly",),
    ),
]

# Highly available masters on etcd (issue 16): fencing, batching, acknowledging.
ETCD_TESTS = ("tests/test_etcd_registry.py",)
HA_TESTS = ("tests/test_ha_edges.py", "tests/test_ha_masters.py")
HA_BUGS = [
    Bug(
        "unguarded registry write",
        "master/etcd_registry.py",
        "guards = self._fence.guards() if self._fence else []",
        "guards: list[Guard] = []",
        ETCD_TESTS,
    ),
    Bug(
        "registry transaction over etcd's operation limit",
        "master/etcd_registry.py",
        "if op.key not in self.ops and len(self.ops) >= MAX_TXN_OPS:",
        "if op.key not in self.ops and len(self.ops) >= 10 * MAX_TXN_OPS:",
        ETCD_TESTS,
    ),
    Bug(
        "a put under a prefix deleted in the same registry transaction",
        "master/etcd_registry.py",
        "        if any(op.key.startswith(p) for p in self.prefixes):\n            return False\n",
        "",
        ETCD_TESTS,
    ),
    Bug(
        "acknowledged before the registry write is durable",
        "master/servicers.py",
        "            await master.registry.durable()\n",
        "            pass\n",
        HA_TESTS,
    ),
    Bug(
        "a standby's HTTP serves instead of redirecting to the leader",
        "master/ha.py",
        "        if leadership.is_leading():\n            return await handler(request)",
        "        if True:\n            return await handler(request)",
        HA_TESTS,
    ),
    Bug(
        "a master that does not lead takes gRPC calls",
        "master/ha.py",
        "        if not self._leadership.is_leading():\n            return self._refuse",
        "        if False:\n            return self._refuse",
        HA_TESTS,
    ),
    Bug(
        "a leader's term outlives its lease on its own clock",
        "master/election.py",
        "not self.lost.is_set() and self._clock() < self._deadline",
        "not self.lost.is_set()",
        HA_TESTS,
    ),
    Bug(
        "a standby names no leader",
        "master/ha.py",
        "        ((LEADER_METADATA, leader.grpc),),",
        "        (),",
        HA_TESTS,
    ),
    Bug(
        "the leader never compacts etcd's history",
        "master/ha.py",
        "                    await self.client.compact(revision)\n",
        "                    pass\n",
        HA_TESTS,
    ),
    Bug(
        "a standby listens without the cluster's TLS",
        "master/ha.py",
        "self.port = grpc_utils.bind(self._grpc, self._host, self._want_port, self._tls)",
        "self.port = grpc_utils.bind(self._grpc, self._host, self._want_port, None)",
        ("tests/test_ha_edges.py",),
    ),
    Bug(
        "the registry writes after the term is over on the master's clock",
        "master/etcd_registry.py",
        "        if not self._leading():\n",
        "        if False:\n",
        ("tests/test_ha_edges.py",),
    ),
    Bug(
        "a master that does not lead runs its periodic actions",
        "master/server.py",
        "        if not when():\n            continue\n",
        "",
        ("tests/test_ha_edges.py",),
    ),
    Bug(
        "a deposed leader's streams go on sending",
        "master/servicers.py",
        "        if not leading():\n            outbox.close",
        "        if False:\n            outbox.close",
        HA_TESTS,
    ),
]

# The simulator (issue 18): it must run the real core in virtual time, and ask for what
# each policy's frameworks would ask for.
SIM_TESTS = ("tests/test_simulator.py",)
PREEMPTION_TESTS = ("tests/test_preemption.py",)
UI_PREEMPTION_TESTS = (
    "tests/test_ui_browser.py::test_a_task_being_preempted_shows_its_badge_until_it_is_killed",
)
SIM_BUGS = [
    Bug(
        "the allocator ignores declared demand",
        "master/allocator.py",
        "framework.demand = tuple(shape for shape, _ in pairs)",
        "framework.demand = None",
        ("tests/test_allocator.py", "tests/test_demand.py"),
    ),
    Bug(
        "preemption without a grace period",
        "master/preemptions.py",
        "        timer = self._timers.call_later(grace, self._grace_over, *key)",
        "        timer = self._timers.call_later(0.0, self._grace_over, *key)",
        ("tests/test_preemptions.py",),
    ),
    Bug(
        "preemption: no hold (the freed resources go straight back to the victim's framework)",
        "master/preemptions.py",
        "        return self.config.preemption_hold",
        "        return 0.0",
        ("tests/test_preemptions.py",),
    ),
    Bug(
        "preemption: the hold filters only what is free then (any larger offer passes it)",
        "master/allocator.py",
        "            self._add_filter(framework_id, agent, agent.total, seconds)",
        "            self._add_filter(framework_id, agent, agent.free, seconds)",
        ("tests/test_preemptions.py",),
    ),
    Bug(
        "preemption: a guarantee taken back beyond the role's declared demand",
        "master/preemptions.py",
        "                _within(guarantee, demands.get(path)),",
        "                guarantee,",
        ("tests/test_preemptions.py",),
    ),
    Bug(
        "preemption plans again for what it already took",
        "master/preemptions.py",
        "        for (framework_id, task_id), p in self.preempting.items():",
        "        for (framework_id, task_id), p in {}.items():",
        ("tests/test_preemptions.py",),
    ),
    Bug(
        "fair levels: a CPU-only role is given a share of memory",
        "master/fair_levels.py",
        "        elif path in confine:",
        "        elif False:",
        ("tests/test_preemption.py", "tests/test_preemptions.py"),
    ),
    Bug(
        "fair levels: preemption measures roles without what their tasks hold",
        "master/role_settings.py",
        "self._share_inputs(), self.allocator.total, tree.active_roles(), demands, held",
        "self._share_inputs(), self.allocator.total, tree.active_roles(), demands",
        ("tests/test_preemptions.py",),
    ),
    Bug(
        "preemption: a task whose grace ended while its agent was away is never killed",
        "master/agents.py",
        "self._kills_owed(agent) + self._preemption_kills_owed(agent.agent_id) + unplaced",
        "self._kills_owed(agent) + unplaced",
        ("tests/test_preemptions.py",),
    ),
    Bug(
        "/state's instantaneous fair shares are not the demand-capped ones preemption uses",
        "master/role_settings.py",
        "        return self._steady_shares, self.instantaneous_fair_shares().fair",
        "        return self._steady_shares, compute_fair_shares(\n"
        "            inputs, total, self.allocator.roles.active_roles()\n        )",
        ("tests/test_demand.py",),
    ),
    Bug(
        "preempt creating a new deficit (victim pushed below its threshold of its fair share)",
        "master/preemption.py",
        "            if below_guarantee(after, v.guarantee) or below_fair_share(\n"
        "                _with(v, after), total, policy\n            ):",
        "            if below_guarantee(after, v.guarantee):",
        PREEMPTION_TESTS,
    ),
    Bug(
        "preempt below the victim's guarantee",
        "master/preemption.py",
        "            if below_guarantee(after, v.guarantee) or below_fair_share(",
        "            if False or below_fair_share(",
        PREEMPTION_TESTS,
    ),
    Bug(
        "preempt from a role no longer above the starved one",
        "master/preemption.py",
        "            if kind is Kind.FAIR_SHARE and share(victim, after) < share(",
        "            if False and share(victim, after) < share(",
        PREEMPTION_TESTS,
    ),
    Bug(
        "ui: a task being preempted shows no badge",
        "master/ui/app.js",
        "    if (!p) return null;\n    const when",
        "    if (p || !p) return null;\n    const when",
        UI_PREEMPTION_TESTS,
    ),
    Bug(
        "ui: the preempting badge does not say for whom",
        "master/ui/app.js",
        "    b.title = `for role ${p.for_role} (${p.kind.replace('_', '-')})`;",
        "    b.title = `(${p.kind.replace('_', '-')})`;",
        UI_PREEMPTION_TESTS,
    ),
    Bug(
        "sim: a task ends as it starts",
        "mesolite/lab/sim/engine.py",
        "                    task.duration, self._task_ended, agent_id, job, task,",
        "                    0.0, self._task_ended, agent_id, job, task,",
        SIM_TESTS,
    ),
    Bug(
        "sim: slots ask for the task's own resources",
        "mesolite/lab/sim/engine.py",
        "        if self._slot is None:\n            return resources",
        "        if True:\n            return resources",
        SIM_TESTS,
    ),
]


def run(bug: Bug, tests: tuple[str, ...]) -> tuple[bool, float, str]:
    path = Path(bug.path)
    original = path.read_text()
    if original.count(bug.old) != 1:
        raise SystemExit(f"{bug.name}: the code to change is not found once in {bug.path}")
    started = time.monotonic()
    try:
        path.write_text(original.replace(bug.old, bug.new))
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
            capture_output=True,
            text=True,
            # Stop the property tests at the first failure instead of shrinking it.
            env={"MESOLITE_HYPOTHESIS_PROFILE": "fail-fast", **os.environ},
        )
    finally:
        path.write_text(original)
    failed = [
        line.split()[1].split("::")[-1]
        for line in result.stdout.splitlines()
        if line.startswith("FAILED")
    ]
    return result.returncode != 0, time.monotonic() - started, "\n        ".join(failed)


# The Mesos scheduler HTTP API (issue 17): its status codes, framing, semantics, bounds.
MESOS_TESTS = ("tests/test_mesos_api.py", "tests/test_mesos_core.py")
MESOS_BUGS = [
    Bug(
        "mesos: a call with a stale stream id is carried out",
        "master/mesos_api/endpoint.py",
        "if stream_id != subscription.stream_id:",
        "if stream_id is None:",
        MESOS_TESTS,
    ),
    Bug(
        "mesos: a call for another principal's framework is carried out",
        "master/mesos_api/endpoint.py",
        "if framework.principal != principal:",
        "if False:",
        ("tests/test_mesos_trust.py",),
    ),
    Bug(
        "mesos: a record's length counts characters, not bytes",
        "master/mesos_api/recordio.py",
        'return b"%d\\n%b" % (len(record), record)',
        'return b"%d\\n%b" % (len(record.decode(errors="replace")), record)',
        MESOS_TESTS,
    ),
    Bug(
        "mesos: the task bound is checked after converting the tasks",
        "master/mesos_api/wire.py",
        "    if problem := _json_bounds(document):\n        raise BadCall(problem)\n",
        "",
        MESOS_TESTS,
    ),
    Bug(
        "mesos: one bad task fails the whole accept",
        "master/offers.py",
        "self._task_error(framework_id, agent_id, task.task_id, why)\n                continue",
        "self._invalid_offers(framework, offer_ids, tasks, why)\n                return",
        MESOS_TESTS,
    ),
    Bug(
        "mesos: partition states reach frameworks that are not partition-aware",
        "master/mesos_api/convert.py",
        "if state in _PARTITION_STATES and not partition_aware:",
        "if state in _PARTITION_STATES and partition_aware:",
        MESOS_TESTS,
    ),
    Bug(
        "mesos: negative refuse_seconds taken as given",
        "master/mesos_api/convert.py",
        "    if not value >= 0:  # negative, or NaN\n",
        "    if value != value:  # NaN\n",
        MESOS_TESTS,
    ),
    Bug(
        "mesos: KILL of an unknown task is ignored",
        "master/status_updates.py",
        "        self.reconcile(framework_id, [task_id])\n",
        "",
        MESOS_TESTS,
    ),
    Bug(
        "mesos: an idle calls connection is not held open",
        "mesolite/http_serving.py",
        "        protocol._next_keepalive_close_time = until  # type: ignore[attr-defined]",
        "        pass",
        (
            "tests/test_mesos_pymesos.py::test_an_idle_subscription_and_calls_connection_outlive_100_seconds",
        ),
    ),
    Bug(
        "mesos: a revoked token's subscription lives on",
        "master/mesos_api/endpoint.py",
        "unwatch = self._authn.watch_request(request, outbox.close)",
        "unwatch = self._authn.watch_request(request, lambda reason: None)",
        ("tests/test_mesos_trust.py",),
    ),
    Bug(
        "mesos: a task id with a path separator is taken",
        "master/validation.py",
        '        or "/" in value\n',
        "",
        ("tests/test_mesos_core.py",),
    ),
    Bug(
        "mesos: tasks do not see MESOS_TASK_ID",
        "agent/_task_env.py",
        "        MESOS_TASK_ID=task_id,\n",
        "",
        ("tests/test_mesos_api.py::test_recordio_stream_and_event_shapes",),
    ),
]


# Packing (issue 18: placing declared demand where it fits best) and the block of agents
# that frameworks cannot use because their demand does not fit them.
PACKING_TESTS = ("tests/test_packing.py",)
# Reservations (issue 18: an agent held for a large shape, master/reservations.py).
RESERVATION_TESTS = ("tests/test_reservations.py", "tests/test_packing.py")
PACKING_BUGS = [
    Bug(
        "packing: a task goes to the walked agent, not where it fits best",
        "master/allocator.py",
        "if score < best[0] and not _spoils(free, shape, passed, left):",
        "if False:",
        PACKING_TESTS,
    ),
    Bug(
        "packing: a task placed elsewhere takes the room of a larger shape ahead of it",
        "master/allocator.py",
        "if score < best[0] and not _spoils(free, shape, passed, left):",
        "if score < best[0]:",
        PACKING_TESTS,
    ),
    Bug(
        "packing: a task placed on an agent the framework filtered",
        "master/allocator.py",
        "if refused is None or refused.expires_at <= now or not refused.resources.contains(free):",
        "if True:",
        PACKING_TESTS,
    ),
    Bug(
        "packing: plain best fit, blind to what a task strands",
        "master/allocator.py",
        "    return stranded, left\n",
        "    return 0.0, left\n",
        PACKING_TESTS,
    ),
    Bug(
        "packing: more tasks offered in a cycle than declared",
        "master/allocator.py",
        "left[framework_id][index] -= 1",
        "left[framework_id][index] -= 0",
        PACKING_TESTS,
    ),
    Bug(
        "a framework whose demand does not fit is not counted toward the agent's block",
        "master/allocator.py",
        "framework.unfit_agents.add(agent.agent_id)\n                    agent.blocked_by += 1\n",
        "framework.unfit_agents.add(agent.agent_id)\n",
        PACKING_TESTS,
    ),
    Bug(
        "a new demand leaves the framework counted as unfit where it now fits",
        "master/allocator.py",
        "        self._clear_unfit(framework)\n        if demand is None:",
        "        if demand is None:",
        PACKING_TESTS,
    ),
    Bug(
        "a removed framework stays counted as unfit",
        "master/allocator.py",
        "        self._clear_unfit(framework)\n        self._declared.discard(framework_id)",
        "        self._declared.discard(framework_id)",
        PACKING_TESTS,
    ),
    Bug(
        "a framework that stops wanting offers stays counted as unfit",
        "master/allocator.py",
        "            self._clear_unfit(framework)\n        self._tree.set_wants",
        "        self._tree.set_wants",
        PACKING_TESTS,
    ),
    Bug(
        "the walk counts a filter toward the block again",
        "master/allocator.py",
        "if refused.block_gen != agent.block_gen and framework_id not in agent.unfit:",
        "if framework_id not in agent.unfit:",
        PACKING_TESTS,
    ),
    Bug(
        "packing: whole tasks counted in floating point (1 // 0.1 is 9.0)",
        "master/allocator.py",
        "rest, after = free.remainder(shape), free - shape",
        "rest, after = Resources({n: max(0.0, free.get_amount(n) - min(free.get_amount(m)"
        " // shape.get_amount(m) for m in shape) * shape.get_amount(n)) for n in free}),"
        " free - shape",
        PACKING_TESTS,
    ),
    Bug(
        "packing: a shape beyond the role's limit placed on another agent",
        "master/allocator.py",
        "                continue\n            view = clip(free, headroom)\n",
        "                continue\n            view = free\n",
        PACKING_TESTS,
    ),
    Bug(
        "packing: an agent offered to a framework without demand stays in the cycle's pool",
        "master/allocator.py",
        "self._pool_move(pool, agent, free, offered, whole=True)",
        "self._pool_move(pool, agent, free, offered, whole=False)",
        PACKING_TESTS,
    ),
    Bug(
        "a decline counted toward the block of the agent's earlier free resources",
        "master/allocator.py",
        "        if framework.wants_offers and resources.contains(free):\n"
        "            if agent.blocked_free != free:\n"
        "                self._new_block(agent, free)\n",
        "        if framework.wants_offers and resources.contains(free):\n",
        FAST_TESTS,
    ),
    Bug(
        "a hold counts a framework already counted as unfit again",
        "master/allocator.py",
        "if framework_id not in agent.unfit:  # else it is counted already",
        "if True:",
        PACKING_TESTS,
    ),
    Bug(
        "reservations: a reservation never times out",
        "master/allocator.py",
        "if now - reservation.since >= self.reservation_timeout:",
        "if False:",
        RESERVATION_TESTS,
    ),
    Bug(
        "reservations: those behind the reserver are offered what frees on its agent",
        "master/allocator.py",
        "free = surplus(whole, reservation.shape)",
        "free = whole",
        RESERVATION_TESTS,
    ),
    Bug(
        "reservations: made for the framework second in order",
        "master/allocator.py",
        "first = next(self._tree.candidates(), None)",
        "first = next(iter(list(self._tree.candidates())[1:]), None)",
        RESERVATION_TESTS,
    ),
    Bug(
        "reservations: the agent is not offered to the reserver when the shape fits",
        "master/allocator.py",
        "and self._fulfils(reservation, offered, left)",
        "and False",
        RESERVATION_TESTS,
    ),
    Bug(
        "reservations: kept when the demand no longer names the shape",
        "master/allocator.py",
        "if self._reservations[agent_id].shape not in wanted:",
        "if False:",
        RESERVATION_TESTS,
    ),
    Bug(
        "reservations: kept for a framework that stopped wanting offers",
        "master/allocator.py",
        'self._end_reservation(agent_id, "not_wanting")',
        "pass",
        RESERVATION_TESTS,
    ),
    Bug(
        "reservations: the cluster's bound ignored",
        "master/allocator.py",
        "            cluster_bound(len(self._agents)) - len(self._reservations),\n",
        "            self.max_reservations,\n",
        RESERVATION_TESTS,
    ),
    Bug(
        "reservations: kept on an agent the reserver declined",
        "master/allocator.py",
        '                self._end_reservation(agent_id, "filtered", now)',
        "                pass",
        RESERVATION_TESTS,
    ),
    Bug(
        "reservations: an agent reserved where only the reserver's own tasks must end",
        "master/allocator.py",
        "others = agent.total - agent.by_framework.get(framework_id, EMPTY)",
        "others = agent.total",
        RESERVATION_TESTS,
    ),
    Bug(
        "reservations: not the agent closest to fitting",
        "master/allocator.py",
        "        ranked.sort()\n",
        "",
        RESERVATION_TESTS,
    ),
    Bug(
        "reservations: the simulator ignores its reservations switch",
        "mesolite/lab/sim/engine.py",
        "            reservations=settings.reservations,\n",
        "",
        RESERVATION_TESTS,
    ),
    Bug(
        "the simulator ignores its packing switch",
        "mesolite/lab/sim/engine.py",
        "            packing=settings.packing,\n",
        "",
        PACKING_TESTS,
    ),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=[], help="substrings of bug names")
    parser.add_argument("--tests", nargs="*", default=[], help="test files to run")
    args = parser.parse_args()
    missed = 0
    for bug in [*BUGS, *OPERATOR_BUGS, *HA_BUGS, *MESOS_BUGS, *SIM_BUGS, *PACKING_BUGS]:
        if args.only and not any(s in bug.name for s in args.only):
            continue
        tests = tuple(args.tests) or bug.tests or FAST_TESTS
        caught, seconds, failures = run(bug, tests)
        missed += not caught
        print(f"{'caught' if caught else 'MISSED'}  {seconds:5.1f}s  {bug.name}", flush=True)
        if failures:
            print(f"        {failures}", flush=True)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
