"""Hypothesis strategies for HTTP requests to the master's server and an agent's sandbox
server, valid or not.

    request = data.draw(master_requests(ids))     # /state, /metrics, the UI, the proxy
    request = data.draw(sandbox_requests(ids))    # an agent's /sandbox/...
    raw = data.draw(raw_requests())               # bytes on a TCP connection

Paths follow the routes (`master/http.py`, `master/ui_routes.py`,
`agent/sandbox_http.py`) with their segments real (`ids`: an agent, a framework and
a task whose sandbox exists), made up, or garbage: percent-encoded NUL, slashes and
dots, non-ASCII, segments longer than a file name may be. Queries set `offset` and
`length` to integers at their bounds, negative, huge, or not integers at all.
Headers are the ones a server might read (Host, Authorization, Range, ...), with
odd values; methods and bodies vary too.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote

from hypothesis import strategies as st

from tests.support.wire_strategies import PLAIN_IDS, weighted


@dataclass(frozen=True, slots=True)
class Ids:
    """Real ids: an agent whose sandbox server runs a task's sandbox."""

    agent_id: str
    framework_id: str
    task_id: str


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    target: str  # path and query, percent-encoded as sent
    headers: tuple[tuple[str, str], ...]
    body: bytes


# Path segments, percent-encoded as they go on the wire.
ODD_SEGMENTS = (
    "",
    ".",
    "..",
    "%2e%2e",
    "%2E",
    "%2F",
    "a%2Fb",
    "%00",
    "a%00",
    "%5C",
    "%0A",
    "%20",
    "%25",
    "%ff",
    "%C3%A9",
    "%F0%9F%98%80",
    "%ED%A0%80",  # a surrogate, which UTF-8 may not encode
    "%C0%AE",  # an overlong ".", not UTF-8 either
    "~",
    "*",
    ";",
    "a;b=c",
    "stdout",
)
SEGMENTS_PAST_NAME_MAX = st.sampled_from((255, 256, 300, 1000)).map(lambda n: "a" * n)
ANY_SEGMENTS = weighted(
    (3, st.sampled_from(ODD_SEGMENTS)),
    (2, PLAIN_IDS),
    (1, SEGMENTS_PAST_NAME_MAX),
    (1, st.text(max_size=8).map(lambda s: quote(s, safe=""))),
)
FILES = weighted((6, st.sampled_from(("stdout", "stderr"))), (1, ANY_SEGMENTS))
NUMBERS = (
    "0",
    "1",
    "-1",
    "65536",
    "1048576",
    "1048577",
    "99999999999999999999999999",
    "9" * 5000,
    "1e3",
    "0x10",
    "1_000",
    "+5",
    " 5",
    "%C2%B3",  # a superscript 3: a digit to str.isdigit, not to int()
    "%D9%A3",  # an Arabic-Indic 3: int() takes it
    "",
    "abc",
    "nan",
)
QUERIES = weighted(
    (2, st.just("")),
    (
        4,
        st.lists(
            st.tuples(
                st.sampled_from(
                    ("offset", "length", "offset", "length", "x", "", "completed_tasks")
                ),
                st.sampled_from(NUMBERS),
            ),
            max_size=3,
        ).map(lambda pairs: "&".join(f"{k}={v}" for k, v in pairs)),
    ),
    (1, st.sampled_from(("%", "%zz", "&&&", "=", "offset", "a=b=c", "#frag"))),
)
HEADER_VALUES = weighted(
    (3, st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=16)),
    (
        2,
        st.sampled_from(
            (
                "",
                "evil.example",
                "127.0.0.1:1",
                "localhost",
                "[::1]",
                "a" * 8000,
                "Bearer ",
                "Bearer x",
                "Basic Og==",
                "bytes=0-1",
                "bytes=-5",
                "bytes=5-",
                "bytes=9-1",
                "bytes=0-1,2-3",
                "gzip, br, deflate",
                "text/event-stream",
                "*/*",
                "close",
                "upgrade",
                "websocket",
            )
        ),
    ),
)
HEADER_NAMES = (
    "Host",
    "Authorization",
    "Range",
    "Accept",
    "Accept-Encoding",
    "If-None-Match",
    "If-Modified-Since",
    "Cookie",
    "Origin",
    "X-Forwarded-For",
    "X-Forwarded-Host",
    "Connection",
    "Upgrade",
    "Content-Type",
    "Last-Event-ID",
)
HEADERS = st.lists(st.tuples(st.sampled_from(HEADER_NAMES), HEADER_VALUES), max_size=4).map(tuple)
METHODS = weighted(
    (8, st.just("GET")),
    (1, st.sampled_from(("HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH", "TRACE", "FOO"))),
)
BODIES = weighted((4, st.just(b"")), (1, st.binary(max_size=64)))


def segment(real: str) -> st.SearchStrategy[str]:
    """Mostly the real id (quoted as a client would), else anything."""
    return weighted((3, st.just(quote(real, safe=""))), (2, ANY_SEGMENTS))


@st.composite
def _requests(draw: st.DrawFn, paths: st.SearchStrategy[str]) -> Request:
    path = draw(paths)
    query = draw(QUERIES)
    return Request(
        method=draw(METHODS),
        target=f"{path}?{query}" if query else path,
        headers=draw(HEADERS),
        body=draw(BODIES),
    )


@st.composite
def _sandbox_paths(draw: st.DrawFn, ids: Ids, prefix: str) -> str:
    parts = [draw(segment(ids.framework_id)), draw(segment(ids.task_id)), draw(FILES)]
    return prefix + "/".join(parts)


def _other_paths(known: tuple[str, ...]) -> st.SearchStrategy[str]:
    """Paths near the routes: a known one bent, or made of garbage segments."""
    bent = st.tuples(
        st.sampled_from(known), st.sampled_from(("", "/", "//", "%00", "/..", "/x", "?"))
    ).map("".join)
    made_up = st.lists(ANY_SEGMENTS, min_size=1, max_size=4).map(lambda s: "/" + "/".join(s))
    odd = st.sampled_from(("//state", "/STATE", "/./state"))
    return weighted((2, bent), (1, made_up), (1, odd))


MASTER_PATHS = ("/state", "/metrics", "/", "/ui/app.js", "/ui/style.css", "/events")


OPERATOR_BODIES = weighted(  # hypothesis draws the first choices most
    (2, st.sampled_from((b"{}" + b" " * 5000, b"{" + b" " * 4095 + b"}"))),  # the bound
    (4, st.just(b"{}")),
    (2, st.sampled_from((b"", b"[]", b"null", b'{"x": 1}', b"{", b"\xff\xfe", b'"{}"'))),
    (1, st.binary(max_size=64)),
)
OPERATOR_TYPES = weighted(
    (4, st.just("application/json")),
    (
        1,
        st.sampled_from(
            (
                "application/x-www-form-urlencoded",
                "text/plain",
                "application/json; charset=latin-1",
                "",
                "multipart/form-data; boundary=x",
            )
        ),
    ),
)


@st.composite
def operator_requests(draw: st.DrawFn, ids: Ids) -> Request:
    """The operator API: a teardown or a kill, mostly as the CLI sends them (POST,
    JSON, `{}`), of the real framework and task or of anything."""
    framework = draw(segment(ids.framework_id))
    if draw(st.booleans(), label="kill"):
        path = f"/api/v1/frameworks/{framework}/tasks/{draw(segment(ids.task_id))}/kill"
    else:
        path = f"/api/v1/frameworks/{framework}/teardown"
    method = draw(weighted((6, st.just("POST")), (1, METHODS)))
    headers = (("Content-Type", draw(OPERATOR_TYPES)), *draw(HEADERS))
    return Request(method, path, headers, draw(OPERATOR_BODIES))


def master_requests(ids: Ids) -> st.SearchStrategy[Request]:
    """Requests to the master's HTTP server: its routes, the sandbox proxy above all;
    the operator API too."""
    ui = st.tuples(
        st.just("/ui/"), weighted((2, st.sampled_from(("app.js", "index.html"))), (1, ANY_SEGMENTS))
    ).map("".join)
    proxy = _sandbox_paths(ids, f"/agents/{quote(ids.agent_id)}/sandbox/")
    unknown_agent = st.builds(
        lambda agent, rest: f"/agents/{agent}/sandbox/{rest}",
        ANY_SEGMENTS,
        _sandbox_paths(ids, ""),
    )
    paths = weighted(
        (3, st.sampled_from(MASTER_PATHS)),
        (1, ui),
        (5, proxy),
        (1, unknown_agent),
        (2, _other_paths(MASTER_PATHS)),
    )
    return weighted((8, _requests(paths)), (1, operator_requests(ids)))


def sandbox_requests(ids: Ids) -> st.SearchStrategy[Request]:
    """Requests to an agent's sandbox server."""
    paths = weighted(
        (5, _sandbox_paths(ids, "/sandbox/")), (1, _other_paths(("/sandbox", "/sandbox/")))
    )
    return _requests(paths)


RAW_LINES = (
    b"GET /state HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /state HTTP/1.0\r\n\r\n",
    b"GET /state HTTP/9.9\r\n\r\n",
    b"GET /state\r\n\r\n",
    b"GET  /state HTTP/1.1\r\n\r\n",
    b"GET state HTTP/1.1\r\n\r\n",
    b"GET http://evil/state HTTP/1.1\r\n\r\n",
    b"GET * HTTP/1.1\r\n\r\n",
    b"\r\n\r\n",
    b"GET /state HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
    b"POST /state HTTP/1.1\r\nContent-Length: 5\r\n\r\nab",
    b"POST /state HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"GET /state HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
    b"GET /state HTTP/1.1\r\nX: \x00\r\n\r\n",
    b"GET /state HTTP/1.1\r\n" + b"X: " + b"a" * 70_000 + b"\r\n\r\n",
    b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n",
)


@st.composite
def raw_requests(draw: st.DrawFn) -> bytes:
    """Bytes for a TCP connection to an HTTP server: odd requests, cut or bent."""
    raw = draw(st.sampled_from(RAW_LINES))
    how = draw(st.sampled_from(("as is", "cut", "changed", "random")))
    if how == "cut":
        return raw[: draw(st.integers(1, len(raw) - 1))]
    if how == "changed":
        at = draw(st.integers(0, len(raw) - 1))
        return raw[:at] + bytes([draw(st.integers(0, 255))]) + raw[at + 1 :]
    if how == "random":
        return draw(st.binary(min_size=1, max_size=64))
    return raw
