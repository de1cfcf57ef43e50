"""An outside review's attacks on issue 11's promises that still succeed (red team, at 040832e).

Each test is one attack, run as an attacker would: real gRPC and HTTPS on 127.0.0.1,
real certificates (`mesolite.certs`), an ACL file with two teams in two roles as in the
README's worked example, and the attacker holding nothing but what its principal was
given. Each failed on the code it was written against; the docstring says what the
attack breaks and what a fix could be. Those still open are `xfail(strict=True)` with
the reason: they fail the suite the day the hole is closed, to be turned into plain tests.

The principals: `team-a` (role `a/...`), `team-b` (role `b/...`), `admin`, the agents
`agent` (LocalCluster's own agents) and `agent-1`, and a token principal `team-b-tok`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import pwd
import resource
import signal
import ssl
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import grpc.aio
import pytest

from mesolite import certs, grpc_utils
from mesolite.framework_sdk import Resources, TaskSpec, TaskState
from mesolite.tls import TlsConfig
from mesolite.v1 import agent_pb2, agent_pb2_grpc, common_pb2, scheduler_pb2, scheduler_pb2_grpc
from tests.cluster import LocalCluster, MasterProcess, fast, free_port
from tests.recording import RecordingFramework, running
from tests.waiting import wait_for_condition, within

pytestmark = pytest.mark.integration

Call = scheduler_pb2.Call
AgentCall = agent_pb2.AgentCall
YEAR = 365 * 24 * 3600.0

ACLS = {
    "register_frameworks": [
        {"principals": {"values": ["team-a"]}, "roles": {"values": ["a", "a/*"]}},
        {"principals": {"values": ["team-b", "team-b-tok"]}, "roles": {"values": ["b", "b/*"]}},
    ],
    "register_agents": [{"principals": {"values": ["agent", "agent-1"]}}],
    "view_state": [{"principals": {"values": ["team-a", "team-b", "admin"]}}],
    "access_sandboxes": [
        {"principals": {"values": ["admin"]}, "framework_principals": {"type": "ANY"}},
        {"principals": {"values": ["team-a"]}, "framework_principals": {"values": ["team-a"]}},
        {"principals": {"values": ["team-b"]}, "framework_principals": {"values": ["team-b"]}},
    ],
}


@pytest.fixture(scope="module")
def team_certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("certs") / "certs"
    certs.init_cluster(directory, principals=["team-a", "team-b", "admin"], tokens=["team-b-tok"])
    certs.issue(directory, "agent-1", hosts=["127.0.0.1"])
    return directory


def acl_file(directory: Path, users: tuple[str, str] | None = None) -> Path:
    """`ACLS`; with `users`, team A may run its tasks as the first, team B as the second
    (the README's `run_tasks`)."""
    acls: dict[str, Any] = dict(ACLS)
    if users is not None:
        acls["run_tasks"] = [
            {"principals": {"values": ["team-a"]}, "users": {"values": [users[0]]}},
            {"principals": {"values": ["team-b", "team-b-tok"]}, "users": {"values": [users[1]]}},
        ]
    path = directory / "acls.json"
    path.write_text(json.dumps(acls))
    return path


@contextlib.asynccontextmanager
async def two_teams(
    tmp_path: Path, certs_dir: Path, *, users: tuple[str, str] | None = None, **config: Any
) -> AsyncIterator[LocalCluster]:
    """The README's two-team cluster: TLS, tokens on a token port, the ACL file."""
    cluster = LocalCluster(
        tmp_path,
        fast(acls_file=acl_file(tmp_path, users), **config),
        certs=certs_dir,
        token_port=True,
    )
    async with cluster:
        yield cluster


def bundle(certs_dir: Path, name: str) -> TlsConfig:
    return TlsConfig.from_dir(certs_dir / name)


def token_of(certs_dir: Path, name: str) -> str:
    return (certs_dir / name / "token").read_text().strip()


class RawStream:
    """One bidi stream, spoken with raw protobuf; every event it receives is kept (read
    by one background task, so waiting never cancels the call)."""

    def __init__(self, channel: grpc.aio.Channel, call: Any) -> None:
        self.channel = channel
        self.call = call
        self.events: list[Any] = []
        self.error: grpc.aio.AioRpcError | None = None
        self.ended = asyncio.Event()
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            async for event in self.call:
                self.events.append(event)
        except grpc.aio.AioRpcError as e:
            self.error = e
        except asyncio.CancelledError:
            pass
        finally:
            self.ended.set()

    def kinds(self) -> list[str]:
        return [e.WhichOneof("event") for e in self.events]

    async def first(self, kind: str, timeout: float = 20.0) -> Any:
        def found() -> bool:
            return kind in self.kinds() or self.ended.is_set()

        await wait_for_condition(found, timeout, f"a {kind} event")
        for event in self.events:
            if event.WhichOneof("event") == kind:
                return event
        raise AssertionError(f"stream ended without {kind}: {self.error}")

    async def outcome(self, timeout: float = 20.0) -> str:
        """The first event's kind, or the status code the stream ended with."""
        await wait_for_condition(
            lambda: bool(self.events) or self.ended.is_set(), timeout, "the first event"
        )
        if self.events:
            return str(self.events[0].WhichOneof("event"))
        return self.error.code().name if self.error else "ended"

    async def write(self, message: Any) -> None:
        """Send `message`; a stream that has already ended is left to `outcome`."""
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
            await self.call.write(message)

    async def close(self) -> None:
        self.call.cancel()
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader
        await self.channel.close()


async def raw_framework(
    address: str,
    tls: TlsConfig,
    *,
    name: str = "raw",
    role: str = "*",
    failover: float = 0.0,
    framework_id: str = "",
    token: str | None = None,
) -> RawStream:
    channel = grpc_utils.create_channel(address, tls, token)
    call = scheduler_pb2_grpc.SchedulerStub(channel).Connect()
    stream = RawStream(channel, call)
    info = scheduler_pb2.FrameworkInfo(
        name=name, role=role, framework_id=framework_id, failover_timeout_seconds=failover
    )
    await stream.write(Call(subscribe=Call.Subscribe(framework_info=info)))
    return stream


async def raw_agent(
    address: str,
    tls: TlsConfig,
    *,
    agent_id: str = "",
    tasks: tuple[agent_pb2.RunningTask, ...] = (),
    cpus: float = 4,
) -> RawStream:
    channel = grpc_utils.create_channel(address, tls)
    call = agent_pb2_grpc.AgentGatewayStub(channel).Connect()
    stream = RawStream(channel, call)
    register = AgentCall.Register(
        agent_id=agent_id,
        hostname="rogue",
        address="127.0.0.1:1",
        total=common_pb2.Resources(scalars={"cpus": cpus, "mem": 1024}),
        tasks=list(tasks),
    )
    await stream.write(AgentCall(register=register))
    return stream


def running_task(framework_id: str, task_id: str, cpus: float) -> agent_pb2.RunningTask:
    return agent_pb2.RunningTask(
        framework_id=framework_id,
        state=common_pb2.TASK_RUNNING,
        task=common_pb2.TaskInfo(
            task_id=task_id,
            name=task_id,
            command="true",
            resources=common_pb2.Resources(scalars={"cpus": cpus}),
        ),
    )


# 1. Tasks are not isolated from one another -----------------------------------------------


async def test_a_task_of_one_team_cannot_read_another_teams_output_or_environment(
    tmp_path: Path, team_certs: Path, unix_users: tuple[str, str]
) -> None:
    """Promise (README, "Who may do what"): "each team reads only its own tasks' output".
    The ACLs guard the HTTP proxy, but every task ran as the agent's one task user, in
    `<work_dir>/sandboxes/<framework>/<task>`, beside every other framework's sandbox:
    team B launched `cat ../../*/*/stdout` and read team A's output, and
    `/proc/*/environ` gave it team A's secrets.

    Fixed (issue 12): each team's frameworks name their own Unix user
    (`FrameworkInfo.user`, allowed to their principal by the ACLs' `run_tasks`), the
    agent runs their tasks as that user, a sandbox is its user's alone (0700) under
    directories no task can list (0711), and the agent's files are closed to tasks.
    Team B now tries the glob, A's sandbox by its path, A's processes' environments, the
    agent's journal and its private key."""
    user_a, user_b = unix_users
    async with two_teams(tmp_path, team_certs, users=unix_users) as cluster:
        agent = await cluster.add_agent("cpus:2;mem:1024")
        a = RecordingFramework("team-a", role="a", tls=bundle(team_certs, "team-a"), user=user_a)
        b = RecordingFramework("team-b", role="b", tls=bundle(team_certs, "team-b"), user=user_b)
        async with running(a, cluster.address), running(b, cluster.address):
            offer = await a.next_offer(agent_id=agent.agent_id)
            secret = TaskSpec(
                "secret",
                "echo A-PRIVATE-OUTPUT; exec sleep 60",
                Resources(cpus=0.5, mem=32),
                environment={"DB_PASSWORD": "A-PRIVATE-PASSWORD"},
            )
            await a.launch(offer, [secret])
            await a.wait_state("secret", TaskState.RUNNING)
            assert a.framework_id is not None and b.framework_id is not None
            stdout_a = agent.config.work_dir / "sandboxes" / a.framework_id / "secret" / "stdout"
            await wait_for_condition(
                lambda: stdout_a.exists() and b"A-PRIVATE" in stdout_a.read_bytes(),
                what="team A's task to write its output",
            )
            offer = await b.next_offer(agent_id=agent.agent_id)
            # From its sandbox: every sandbox by a glob, A's by its path, the agent's
            # work dir and journal, every process's environment.
            snoop = TaskSpec(
                "snoop",
                "id -un; cat ../../*/*/stdout; ls ../..; "
                f"cat ../../{a.framework_id}/secret/stdout; "
                "ls ../../..; cat ../../../status_updates.jsonl; "
                "for p in /proc/[0-9]*; do tr '\\0' '\\n' < $p/environ; done 2>/dev/null; true",
                Resources(cpus=0.5, mem=32),
                environment={"B_OWN": "B-OWN-VARIABLE"},
            )
            await b.launch(offer, [snoop])
            await b.wait_state("snoop", TaskState.FINISHED)
            # What team B reads of its own task, through the master, as the ACLs allow.
            url = (
                f"{cluster.server.http_url}/agents/{agent.agent_id}/sandbox/"
                f"{b.framework_id}/snoop/stdout?length=1048576"
            )
            context = bundle(team_certs, "team-b").client_context()
            async with aiohttp.ClientSession() as http, http.get(url, ssl=context) as response:
                assert response.status == 200
                seen_by_b = await response.text()
            leaked = [s for s in ("A-PRIVATE-OUTPUT", "A-PRIVATE-PASSWORD") if s in seen_by_b]
            assert leaked == [], f"team B's task read team A's {leaked}"
            # The snoop did run as team B's user, and could read its own environment: the
            # attempts above failed for want of permission, not for a broken command.
            assert seen_by_b.splitlines()[0] == user_b, seen_by_b
            assert "B-OWN-VARIABLE" in seen_by_b, seen_by_b
            assert "update_id" not in seen_by_b, seen_by_b
            stderr = (
                stdout_a.parent.parent.parent / b.framework_id / "snoop" / "stderr"
            ).read_text()
            denied = [line for line in stderr.splitlines() if "Permission denied" in line]
            for path in ("'../..'", "/secret/stdout", "'../../..'", "/status_updates.jsonl"):
                assert any(path in line for line in denied), (path, stderr)
            sandbox_a = stdout_a.parent
            assert (sandbox_a.stat().st_uid, sandbox_a.stat().st_mode & 0o777) == (
                pwd.getpwnam(user_a).pw_uid,
                0o700,
            )


# 2. An agent can still speak for tasks the master never placed on it -------------------


async def test_an_agent_cannot_plant_a_task_in_another_principals_framework(
    tmp_path: Path, team_certs: Path
) -> None:
    """Promise (README, "Ownership"): "An agent reports only the tasks the master placed on
    it". A registered agent (principal `agent-1`) re-registers with its own id and
    reports a task `planted` of team A's framework, which the master never placed
    anywhere: the master adopts it (`_adopt_task`), charges its CPUs to team A
    (dominant share, role limits: team A gets fewer offers), and forwards the agent's
    updates for it to team A, which sees a task it never launched fail. The task id
    is now in use for team A too.

    Fix: in `validation.reported_tasks_problem`, a known agent (not recovering after a
    master restart) may report only tasks `_placed_on` says are on it (None is
    refused too, unless the task has ended); only an agent re-registering after a
    restart may bring tasks the registry placed on it."""
    async with two_teams(tmp_path, team_certs) as cluster:
        a = RecordingFramework("team-a", role="a", tls=bundle(team_certs, "team-a"))
        async with running(a, cluster.address):
            assert a.framework_id is not None
            rogue_tls = bundle(team_certs, "agent-1")
            first = await raw_agent(cluster.address, rogue_tls)
            rogue_id = (await first.first("registered")).registered.agent_id
            again = await raw_agent(
                cluster.address,
                rogue_tls,
                agent_id=rogue_id,
                tasks=(running_task(a.framework_id, "planted", 3.0),),
            )
            try:
                outcome = await again.outcome()
                if outcome == "registered":  # then it speaks for the planted task
                    status = common_pb2.TaskStatus(
                        task_id="planted",
                        framework_id=a.framework_id,
                        agent_id=rogue_id,
                        state=common_pb2.TASK_FAILED,
                        exit_code=66,
                        message="planted by a rogue agent",
                        update_id="planted-1",
                        source=common_pb2.TaskStatus.SOURCE_AGENT,
                    )
                    await again.write(
                        AgentCall(status_update=AgentCall.StatusUpdate(status=status))
                    )
                    await wait_for_condition(
                        lambda: bool(a.states("planted")) or "acknowledge" in again.kinds(),
                        what="the planted task's update to be forwarded or acknowledged",
                    )
                record = cluster.master.frameworks[a.framework_id]
                planted = "planted" in record.tasks or any(
                    t.spec.task_id == "planted" for t in record.completed
                )
                assert not planted, "the master took a task of team A from agent-1's word"
                assert a.states("planted") == [], "team A was told of a task it never launched"
                if outcome == "registered":  # accepted, and told to kill what it made up
                    await again.first("kill_task")
            finally:
                await again.close()
                await first.close()


async def test_tasks_of_unknown_frameworks_do_not_escape_the_framework_limit(
    tmp_path: Path, team_certs: Path
) -> None:
    """Promise (README, "Bounds"): "1,000 frameworks ... per master". An agent that
    re-registers with tasks of framework ids the master does not know gets a stand-in
    framework for each (`AgentHandling._stand_in`), without the limit: one agent
    reporting 10,000 tiny tasks makes 10,000 frameworks (measured: 5,000 ghost tasks
    took the master from 1,000 to 6,000 frameworks in 6.6 s), it ignores the kills
    that follow, and many agents of one principal multiply it.

    Fix: refuse (or count against `max_frameworks`) tasks of unknown frameworks from an
    agent that is not re-registering after a master restart; when one is, count the
    stand-ins against the limit too."""
    async with two_teams(tmp_path, team_certs, max_frameworks=5) as cluster:
        rogue_tls = bundle(team_certs, "agent-1")
        first = await raw_agent(cluster.address, rogue_tls)
        rogue_id = (await first.first("registered")).registered.agent_id
        ghosts = tuple(running_task(f"ghost-{i}", "t", 0.01) for i in range(20))
        again = await raw_agent(cluster.address, rogue_tls, agent_id=rogue_id, tasks=ghosts)
        try:
            await again.outcome()
            frameworks = len(cluster.master.frameworks)
            assert frameworks <= 5, f"{frameworks} frameworks on a master that allows 5"
        finally:
            await again.close()
            await first.close()


# 3. One principal can take what every principal shares ------------------------------------


async def test_one_principal_cannot_take_every_framework_slot(
    tmp_path: Path, team_certs: Path
) -> None:
    """Issue 11 asks for bounds on "frameworks, roles, streams ... per peer"; there is one
    limit for the whole master. Team A subscribes as many frameworks as the master
    allows, each with a failover timeout of a year, and hangs up: they stay (across a
    master restart too, from the registry), and team B is refused for a year: "this
    master has 1000 frameworks, its maximum". Measured with the defaults: 1,000
    subscriptions in 2.8 s. Roles can be used up the same way (`a/x1`, `a/x2`, ...).

    Fix: a per-principal quota of frameworks (and of roles created on first use),
    well under `max_frameworks`; perhaps a lower ceiling on the failover timeout of
    a disconnected framework when the master is near its limit."""
    limits: dict[str, Any] = {"max_frameworks": 10, "max_frameworks_per_principal": 5}
    async with two_teams(tmp_path, team_certs, **limits) as cluster:
        team_a = bundle(team_certs, "team-a")
        for i in range(10):
            stream = await raw_framework(
                cluster.address, team_a, name=f"filler-{i}", role=f"a/x{i}", failover=YEAR
            )
            outcome = await stream.outcome()
            await stream.close()
            if outcome != "subscribed":
                break  # a per-principal limit: what this test wants
        victim = await raw_framework(
            cluster.address, bundle(team_certs, "team-b"), name="victim", role="b"
        )
        try:
            outcome = await victim.outcome()
            detail = victim.error.details() if victim.error else ""
            assert outcome == "subscribed", f"team B refused: {outcome} {detail}"
        finally:
            await victim.close()


# 4. Acknowledgements are not checked --------------------------------------------------------


async def test_a_framework_cannot_send_acknowledgements_to_an_agent_it_has_no_task_on(
    tmp_path: Path, team_certs: Path
) -> None:
    """Promise (issue 11): "no client can act for another". ACKNOWLEDGE names any agent,
    task and update id, and the master forwards it to that agent unchecked
    (`StatusUpdateHandling.acknowledge`). Team A, with no task anywhere, floods
    another principal's agent: with 4 streams of 50,000 acknowledgements the agent's
    outbox overflows (10,000) and the master drops the agent (twice in 12 s; its
    offers rescinded, launches sent meanwhile lost), and the agent logs a line for
    each (109 MB of agent log from 300,000 acknowledgements).

    Fix: forward an acknowledgement only for a task of this framework that the master
    has (or just had) on that agent, with that update id pending; reject the rest as
    a call error (and count them)."""
    async with two_teams(tmp_path, team_certs) as cluster:
        victim = await raw_agent(cluster.address, bundle(team_certs, "agent-1"), cpus=1)
        team_a = await raw_framework(cluster.address, bundle(team_certs, "team-a"), role="a")
        try:
            victim_id = (await victim.first("registered")).registered.agent_id
            offers = (await team_a.first("offers")).offers.offers
            [offer] = [o for o in offers if o.agent_id == victim_id]
            # Acknowledge an update of a task team A does not have, then launch a task:
            # the agent's messages are in order, so the launch comes after the ack.
            ack = Call.Acknowledge(agent_id=victim_id, task_id="not-mine", update_id="u1")
            await team_a.write(Call(acknowledge=ack))
            marker = common_pb2.TaskInfo(
                task_id="marker",
                command="true",
                resources=common_pb2.Resources(scalars={"cpus": 0.1}),
            )
            await team_a.write(Call(accept=Call.Accept(offer_ids=[offer.offer_id], tasks=[marker])))
            await victim.first("launch_task")
            kinds = victim.kinds()
            assert "acknowledge" not in kinds[: kinds.index("launch_task")], (
                "team A's acknowledgement for a task it does not have reached agent-1"
            )
        finally:
            await team_a.close()
            await victim.close()


# 5. An agent's certificate is a master's certificate ----------------------------------------


async def test_an_agent_certificate_cannot_pose_as_the_master(team_certs: Path) -> None:
    """Promise (README): "the master's certificate must chain to ca.crt and name the
    address dialled"; "a framework cannot pose as the master". True of framework
    certificates (client-only), but every agent certificate is a server certificate
    for localhost, 127.0.0.1 and ::1, and clients check nothing more: whoever holds an
    agent's key (any task on that agent can read it: test 1) and gets a client's
    connection to a loopback address (the master restarting, a port taken first)
    is the master to it. A token client hands it its bearer token; an agent would
    take its LaunchTask orders.

    Fix: clients verify the master's identity, not only the CA and the address: give
    the master's certificate a name no other certificate has (a SAN such as
    `mesolite-master`, dialled with `grpc.ssl_target_name_override`, and checked by
    the HTTPS clients), or issue agent certificates only for their own hosts (no
    shared loopback names), or use a separate CA for agents' sandbox servers."""
    captured: list[str] = []

    class Recorder(grpc.GenericRpcHandler):  # type: ignore[misc]
        def service(self, details: grpc.HandlerCallDetails) -> None:
            for key, value in details.invocation_metadata or ():
                if key == "authorization":
                    captured.append(str(value))
            return None

    impostor = grpc.aio.server(handlers=[Recorder()])
    # `agent`: the agent bundle `mesolite certs init` makes, as the README's quick start.
    port = grpc_utils.bind(impostor, "127.0.0.1", 0, bundle(team_certs, "agent"), client_cert=False)
    await impostor.start()
    try:
        token = token_of(team_certs, "team-b-tok")
        stream = await raw_framework(
            f"127.0.0.1:{port}", TlsConfig(team_certs / "ca.crt"), role="b", token=token
        )
        try:
            await stream.outcome(timeout=15)
        finally:
            await stream.close()
        assert token not in " ".join(captured), "the client sent its token to an agent"
    finally:
        await impostor.stop(0)


# 6. Slow HTTP clients hold the master's descriptors -------------------------------------


async def test_slow_unauthenticated_http_clients_cannot_exhaust_the_master(
    tmp_path: Path, team_certs: Path
) -> None:
    """Issue 11: "Bounds on everything a client controls". The HTTPS port asks for a
    client certificate but does not require one (tokens), so anyone completes the
    handshake, and aiohttp waits for request headers for ever: a client that sends a
    header line every 5 s holds its connection indefinitely (1,500 held for 120 s
    in the review, each a descriptor). At the descriptor limit (here 256; 1,024 is
    a common default soft limit) the master can accept nothing: no HTTP, no gRPC
    (`OSError: [Errno 24] Too many open files` in its log, frameworks time out).

    Fixed (mesolite/http_serving.py): a deadline for a connection's request headers,
    caps on connections (in all, and without a client certificate in all and per
    address) fitted below the descriptor limit, and the soft descriptor limit
    raised at start. Unit and deadline tests: tests/test_http_serving.py."""
    http_port, port = free_port(), free_port()
    log = (tmp_path / "master.log").open("wb")
    limit = 256

    def low_descriptor_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "mesolite.cli",
        "master",
        "--port",
        str(port),
        "--http-port",
        str(http_port),
        "--work-dir",
        str(tmp_path / "master"),
        "--tls-dir",
        str(team_certs / "master"),
        "--acls",
        str(acl_file(tmp_path)),
        stdout=asyncio.subprocess.PIPE,
        stderr=log,
        preexec_fn=low_descriptor_limit,
    )
    held: list[asyncio.StreamWriter] = []
    try:
        assert process.stdout is not None
        line = await within(process.stdout.readline(), 30, "the master to start")
        assert b"listening on" in line, line
        anonymous = ssl.create_default_context(cafile=str(team_certs / "ca.crt"))
        for _ in range(limit + 20):
            try:
                _, writer = await asyncio.wait_for(
                    asyncio.open_connection(
                        "127.0.0.1", http_port, ssl=anonymous, server_hostname="127.0.0.1"
                    ),
                    5,
                )
            except (OSError, TimeoutError):
                break  # the master stopped accepting (the attack worked) or refused us
            writer.write(b"GET /state HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # never finished
            held.append(writer)
        # Someone with every right asks for /state while the slow clients hold on.
        admin = bundle(team_certs, "admin").client_context()
        url = f"https://127.0.0.1:{http_port}/state"
        timeout = aiohttp.ClientTimeout(total=15)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            status: int | str
            try:
                async with http.get(url, ssl=admin) as response:
                    status = response.status
            except (aiohttp.ClientError, TimeoutError) as e:
                status = repr(e)
        assert status == 200, (
            f"the admin's GET /state failed while {len(held)} unauthenticated clients "
            f"held unfinished requests: {status}"
        )
    finally:
        for writer in held:
            writer.transport.abort()
        if process.returncode is None:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), 10)
            except TimeoutError:
                process.kill()
                await process.wait()
        log.close()


# 7. Revoking a token leaves its streams open -----------------------------------------------


async def test_a_revoked_token_ends_the_streams_it_opened(tmp_path: Path, team_certs: Path) -> None:
    """README: the credentials file "is reloaded with the ACLs and roles on SIGHUP" (the
    only way to revoke a principal, as certificates cannot be). Removing a token's
    line and sending SIGHUP stops new connections, but a framework that subscribed
    with it keeps its stream, its offers and its launches for as long as it likes
    (checked for 30 s in the review). The same holds for ACL changes.

    Fix: on reload, end (UNAUTHENTICATED / PERMISSION_DENIED) the streams whose
    principal no longer authenticates or is no longer allowed what it subscribed for;
    keep the principal's credential with each stream to re-check it."""
    credentials = tmp_path / "credentials"
    credentials.write_text((team_certs / "credentials").read_text())
    token_port = free_port()
    master = MasterProcess(
        tmp_path,
        "--tls-dir",
        str(team_certs / "master"),
        "--credentials",
        str(credentials),
        "--token-port",
        str(token_port),
        "--acls",
        str(acl_file(tmp_path)),
    )
    await master.start()
    stream: RawStream | None = None
    try:
        stream = await raw_framework(
            f"127.0.0.1:{token_port}",
            TlsConfig(team_certs / "ca.crt"),
            role="b",
            token=token_of(team_certs, "team-b-tok"),
        )
        assert await stream.outcome() == "subscribed"
        credentials.write_text(
            "".join(
                line
                for line in (team_certs / "credentials").read_text().splitlines(keepends=True)
                if not line.startswith("team-b-tok ")
            )
        )
        assert master.process is not None
        master.process.send_signal(signal.SIGHUP)
        log = tmp_path / "master-1.log"
        await wait_for_condition(
            lambda: "credentials reloaded" in log.read_text(), what="the credentials reload"
        )
        ended = stream.ended
        await wait_for_condition(
            ended.is_set, timeout=10, what="the revoked principal's stream to end"
        )
    finally:
        if stream is not None:
            await stream.close()
        await master.stop()


# 8. Removed agents are remembered for ever ------------------------------------------------


async def test_removed_agent_ids_are_bounded(tmp_path: Path, team_certs: Path) -> None:
    """Issue 11: "Bounds on everything a client controls". Every agent the master
    removes stays in `removed_agents` for ever: in memory, in the registry (reloaded
    after a restart) and in every GET /state and /events document. An agent
    principal registers new agents, hangs up, and lets the agent timeout pass, again
    and again (up to `max_agents` at a time, every `--agent-timeout`): /state grows
    without bound. (In loopback mode any local process can.)

    Fix: keep removed agent ids bounded, by count and age (Mesos:
    `--registry_max_agent_count`, `--registry_max_agent_age`), or keep them only as
    long as an agent could come back; this test takes `max_agents` as the bound."""
    async with two_teams(tmp_path, team_certs, max_agents=2, max_removed_agents=2) as cluster:
        for _ in range(3):
            ids = []
            for _ in range(2):
                stream = await raw_agent(cluster.address, bundle(team_certs, "agent-1"))
                ids.append((await stream.first("registered")).registered.agent_id)
                await stream.close()
            await cluster.time_out_agents(*ids)
        removed = len(cluster.master.removed_agents)
        assert removed <= 2, f"{removed} removed agents kept by a master of at most 2"


# 9. Names carry terminal escapes to the operator --------------------------------------------


async def test_names_cannot_send_terminal_escapes_to_the_operator(tmp_path: Path) -> None:
    """Issue 11: "log injection (newlines in names)". Newlines are escaped in the log,
    but a name without whitespace is written raw: a framework named
    `x\\x1b]0;pwned\\x07\\x1b[2J` retitles and clears the terminal of whoever tails the
    master's log, and `mesolite frameworks` prints it raw to the operator too (an
    OSC 52 sequence writes to the clipboard in some terminals). Hostnames, task
    names and attributes are free text in the same way.

    Fix: refuse control and format characters (Unicode categories Cc, Cf) in names,
    hostnames and attributes in `master/validation.py`, and escape them in the CLI
    views and the console log renderer."""
    from tests.test_cli_views import mesolite

    master = MasterProcess(tmp_path)
    await master.start()
    stream: RawStream | None = None
    try:
        channel = grpc_utils.create_channel(master.address)
        call = scheduler_pb2_grpc.SchedulerStub(channel).Connect()
        stream = RawStream(channel, call)
        info = scheduler_pb2.FrameworkInfo(name="x\x1b]0;pwned\x07\x1b[2J", role="*")
        await stream.write(Call(subscribe=Call.Subscribe(framework_info=info)))
        outcome = await stream.outcome()
        _, out, _ = await mesolite("frameworks", "--master", master.http_address)
        log = (tmp_path / "master-1.log").read_text()
        assert "\x1b" not in log, "an escape sequence from a client reached the log raw"
        assert "\x1b" not in out, "an escape sequence from a client reached the terminal"
        assert outcome in ("subscribed", "INVALID_ARGUMENT")
    finally:
        if stream is not None:
            await stream.close()
        await master.stop()


# 10. Task descriptions: 4 MiB each, kept after the task ends, and world-readable on disk ----


def retained_task_bytes(master: Any) -> int:
    """Bytes of commands and environments the master keeps in its task records."""
    total = 0
    for framework in master.frameworks.values():
        for task in (*framework.tasks.values(), *framework.completed):
            spec = task.spec
            total += len(spec.command)
            total += sum(len(k) + len(v) for k, v in spec.environment.items())
    return total


def world_readable(path: Path, below: Path) -> bool:
    """Whether any user may read `path`: the file is o+r and every directory from `below`
    down to it is o+x (the directories above `below` are the test's own)."""
    directories = [p for p in path.parents if p == below or p.is_relative_to(below)]
    return bool(path.stat().st_mode & 0o004) and all(d.stat().st_mode & 0o001 for d in directories)


BIG_ENVIRONMENT = {f"V{i}": "x" * 1_000 for i in range(60)}  # 60 KB, under the 64 KiB bound


async def test_finished_tasks_do_not_keep_their_environment_in_the_master(
    tmp_path: Path, team_certs: Path
) -> None:
    """Issue 11: "Bounds on everything a client controls". Each task may carry 256
    environment variables of 16 KiB (4 MiB, the message limit), and the master keeps
    the whole TaskSpec of every finished task in `completed` (1,000 per framework, 1,000
    frameworks): 4 TB allowed in all. Measured: 400 finished tasks of one framework of
    team A took the master from 0.4 to 1.7 GB RSS in 26 s; a few frameworks of one team
    reach any machine's memory in minutes, and the master (everyone's) dies.

    Fix: keep what a finished task needs (ids, state, resources, its last status), not
    its command and environment; bound a task's environment in total (say 64 KiB), not
    only per variable."""
    async with two_teams(tmp_path, team_certs) as cluster:
        agent = await cluster.add_agent("cpus:2;mem:1024")
        a = RecordingFramework("team-a", role="a", tls=bundle(team_certs, "team-a"))
        async with running(a, cluster.address):
            task_ids = []
            for round_ in range(4):  # ~3 MB a call: the message limit is 4 MiB
                offer = await a.next_offer(agent_id=agent.agent_id)
                tasks = [
                    TaskSpec(
                        f"fat-{round_}-{i}",
                        "true",
                        Resources(cpus=0.1, mem=8),
                        environment=BIG_ENVIRONMENT,
                    )
                    for i in range(3)
                ]
                await a.launch(offer, tasks, refuse_seconds=0)
                task_ids += [t.task_id for t in tasks]
            for task_id in task_ids:
                await a.wait_state(task_id, TaskState.FINISHED)
            retained = retained_task_bytes(cluster.master)
            assert retained < 1024 * 1024, (
                f"the master keeps {retained / 1e6:.1f} MB of commands and environments "
                f"of {len(task_ids)} finished tasks"
            )


async def test_a_tasks_environment_is_not_readable_by_other_users_of_the_agent(
    tmp_path: Path, team_certs: Path
) -> None:
    """Issue 11 item 5: "Sandboxes world-readable". The HTTP side is guarded now, but on
    the agent's disk every sandbox is 0755 and its `task.json` (the task's checkpoint,
    with its whole environment: the secrets a framework passes its tasks) and
    `stdout`/`stderr` are 0644, under a work directory that is 0755: any local user of
    an agent machine reads every team's secrets. They also stay for ever: nothing
    removes the sandboxes of finished tasks (a framework fills an agent's disk at 4 MiB
    of `task.json` a task).

    Fix: create the work directory and sandboxes 0700 (or owned by the task's user,
    see the first test), files 0600; keep secrets out of the checkpoint if it can
    do without them; garbage-collect sandboxes of acknowledged tasks after a delay
    (Mesos: `--gc_delay`, `--disk_watch_interval`)."""
    async with two_teams(tmp_path, team_certs) as cluster:
        agent = await cluster.add_agent("cpus:1;mem:512")
        a = RecordingFramework("team-a", role="a", tls=bundle(team_certs, "team-a"))
        async with running(a, cluster.address):
            offer = await a.next_offer(agent_id=agent.agent_id)
            secret = "A-SECRET-IN-THE-ENVIRONMENT"
            task = TaskSpec(
                "secret", "true", Resources(cpus=0.1, mem=8), environment={"TOKEN": secret}
            )
            await a.launch(offer, [task])
            await a.wait_state("secret", TaskState.FINISHED)
            work_dir = agent.config.work_dir
            exposed = [
                str(path.relative_to(work_dir))
                for path in sorted(work_dir.rglob("*"))
                if path.is_file()
                and secret.encode() in path.read_bytes()
                and world_readable(path, below=work_dir)
            ]
            assert exposed == [], f"other users of the agent machine can read {exposed}"


# 11. Unauthenticated connections write the master's log -----------------------------------


async def test_failed_tls_handshakes_do_not_flood_the_masters_log(
    tmp_path: Path, team_certs: Path
) -> None:
    """Issue 11: "logged input truncated" (rejected calls once wrote 85 MB of log in
    0.7 s). grpcio itself logs every failed TLS handshake on the master's gRPC port at
    INFO, about 205 bytes a line, to the master's stderr: anyone who can reach the port
    (no certificate, no token) opens and closes TCP connections with a byte of garbage,
    2,000 in 0.09 s here, and the log grows about 4.5 MB/s (16 GB an hour).

    Fix: set grpcio's own verbosity to ERROR in the master and the agent
    (`GRPC_VERBOSITY=ERROR` before grpc is imported, as the CLI's entry point can), or
    route its logging through a rate-limited handler."""
    master = MasterProcess(tmp_path, "--tls-dir", str(team_certs / "master"))
    await master.start()
    try:
        log = tmp_path / "master-1.log"
        before = log.stat().st_size
        for _ in range(500):
            _, writer = await asyncio.open_connection("127.0.0.1", master.port)
            writer.write(b"GET / HTTP/1.1\r\n\r\n")
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
        # One more, with a real client: once it is refused, the server has seen the others.
        stream = await raw_framework(master.address, TlsConfig(team_certs / "ca.crt"))
        await stream.outcome()
        await stream.close()
        grown = log.stat().st_size - before
        assert grown < 20_000, f"500 anonymous connections wrote {grown} bytes of master log"
    finally:
        await master.stop()


# 12. Without an ACL file, every principal is every role ------------------------------------


async def test_with_the_starter_acls_a_framework_cannot_register_as_an_agent(
    tmp_path: Path, team_certs: Path
) -> None:
    """Found by the review: with no `--acls` the master allows everything (as Mesos
    does without ACLs), so the `framework` (or any team's) certificate registered as an
    agent, was offered every framework's tasks and received their commands and
    environments. Chosen fix: `mesolite certs init` writes a starter `acls.json` (only
    the agent principal registers agents), the README's quick start passes it, and a
    master with authentication but no ACL file says so loudly at start. Under those
    ACLs the attack is refused."""
    starter = fast(acls_file=team_certs / "acls.json")  # as `certs init` wrote it
    async with LocalCluster(tmp_path, starter, certs=team_certs, token_port=True) as cluster:
        rogue = await raw_agent(cluster.address, bundle(team_certs, "team-a"), cpus=64)
        try:
            outcome = await rogue.outcome()
            assert outcome == "PERMISSION_DENIED", (
                f"team A's framework certificate registered as an agent: {outcome}"
            )
        finally:
            await rogue.close()
