"""The Mesos scheduler API keeps the cluster's trust guarantees (README "Securing a
cluster"): TLS with a certificate or a bearer token, and a framework's calls only from
the principal that subscribed it."""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from mesolite import certs
from mesolite.master.mesos_api import recordio
from mesolite.tls import TlsConfig
from tests.cluster import LocalCluster


@pytest.fixture(scope="module")
def team_certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("certs") / "certs"
    certs.init_cluster(directory, principals=["team-a", "team-b"], tokens=["team-b-tok"])
    return directory


@pytest.fixture
async def cluster(tmp_path: Path, team_certs: Path) -> AsyncIterator[LocalCluster]:
    async with LocalCluster(tmp_path, certs=team_certs) as c:
        yield c


def context(team_certs: Path, name: str) -> ssl.SSLContext:
    return TlsConfig.from_dir(team_certs / name).client_context()


def subscribe_body(name: str, **info: Any) -> dict[str, Any]:
    return {
        "type": "SUBSCRIBE",
        "subscribe": {"framework_info": {"user": "", "name": name, **info}},
    }


async def test_principals_own_their_frameworks(cluster: LocalCluster, team_certs: Path) -> None:
    url = f"{cluster.server.http_url}/api/v1/scheduler"
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    anonymous = ssl.create_default_context(cafile=str(team_certs / "team-a" / "ca.crt"))
    async with aiohttp.ClientSession() as session:
        async with session.post(url, json=subscribe_body("x"), headers=headers, ssl=anonymous) as r:
            assert r.status == 401  # neither a certificate nor a token

        a = context(team_certs, "team-a")
        response = await session.post(url, json=subscribe_body("a"), headers=headers, ssl=a)
        assert response.status == 200
        decoder = recordio.Decoder()
        records: list[bytes] = []
        while not records:
            records += decoder.feed(await response.content.readany())
        framework_id = json.loads(records[0])["subscribed"]["framework_id"]["value"]
        assert cluster.master.frameworks[framework_id].principal == "team-a"
        stream_id = response.headers["Mesos-Stream-Id"]
        revive = {"type": "REVIVE", "framework_id": {"value": framework_id}}
        call_headers = {"Mesos-Stream-Id": stream_id}

        b = context(team_certs, "team-b")
        async with session.post(url, json=revive, headers=call_headers, ssl=b) as r:
            assert r.status == 400 and "does not match" in await r.text()
        token = (team_certs / "team-b-tok" / "token").read_text().strip()
        by_token = {**call_headers, "Authorization": f"Bearer {token}"}
        async with session.post(url, json=revive, headers=by_token, ssl=anonymous) as r:
            assert r.status == 400  # a token is a principal too, and not team-a
        async with session.post(url, json=revive, headers=call_headers, ssl=a) as r:
            assert r.status == 202

        # No subscribing in another principal's name.
        claim = subscribe_body("b", principal="team-a")
        async with session.post(url, json=claim, headers=headers, ssl=b) as r:
            assert r.status == 400 and "does not match" in await r.text()
        response.close()


async def test_a_revoked_token_ends_its_subscription(
    cluster: LocalCluster, team_certs: Path, tmp_path: Path
) -> None:
    url = f"{cluster.server.http_url}/api/v1/scheduler"
    token = (team_certs / "team-b-tok" / "token").read_text().strip()
    headers = {
        "Content-Type": "application/json",
        "Accept": "application/json",
        "Authorization": f"Bearer {token}",
    }
    only_ca = ssl.create_default_context(cafile=str(team_certs / "team-a" / "ca.crt"))
    async with aiohttp.ClientSession() as session:
        response = await session.post(url, json=subscribe_body("b"), headers=headers, ssl=only_ca)
        assert response.status == 200
        decoder = recordio.Decoder()
        events: list[dict[str, Any]] = []
        while not events:
            events += [json.loads(r) for r in decoder.feed(await response.content.readany())]
        assert events[0]["type"] == "SUBSCRIBED"
        # The operator drops the token from the credentials file and reloads (SIGHUP).
        credentials = cluster.config.credentials_file
        assert credentials is not None
        kept = [line for line in credentials.read_text().splitlines() if "team-b-tok" not in line]
        revoked = tmp_path / "credentials"
        revoked.write_text("\n".join(kept) + "\n")
        cluster.server.authn._file = revoked
        cluster.server.authn.reload()
        async with asyncio.timeout(10):
            async for chunk in response.content.iter_any():
                events += [json.loads(r) for r in decoder.feed(chunk)]
        assert events[-1]["type"] == "ERROR" and "revoked" in events[-1]["error"]["message"]
        framework_id = events[0]["subscribed"]["framework_id"]["value"]
        framework = cluster.master.frameworks.get(framework_id)
        assert framework is None or not framework.connected  # gone: no failover timeout
