"""`mesolite certs`, bearer-token credentials and the TLS options, without a network.

The certificates are checked twice: by `cryptography`'s own path validation, and by a
real TLS handshake between the contexts the master and the clients use, run through
memory buffers (OpenSSL, as in production, with no sockets).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import ssl
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from cryptography.x509.verification import PolicyBuilder, Store, VerificationError

from mesolite import certs, credentials, tls_options
from mesolite.cli import main
from mesolite.tls import (
    TlsConfig,
    TlsError,
    check_listen,
    is_loopback,
    principal_of_peercert,
)

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def cluster_certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("certs") / "c"
    certs.init_cluster(directory, hosts=["master.example"], tokens=["ci"])
    return directory


@pytest.fixture(scope="module")
def other_certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("other") / "c"
    certs.init_cluster(directory)
    return directory


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def _verify_server(directory: Path, bundle: str, host: str) -> None:
    store = Store([_cert(directory / "ca.crt")])
    verifier = PolicyBuilder().store(store).build_server_verifier(x509.DNSName(host))
    verifier.verify(_cert(directory / bundle / "tls.crt"), [])


# The chain -------------------------------------------------------------------------


def test_init_writes_a_bundle_per_principal_with_its_name_as_cn(cluster_certs: Path) -> None:
    for name in ("master", "agent", "framework", "admin"):
        cert = _cert(cluster_certs / name / "tls.crt")
        [cn] = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        assert cn.value == name
        assert (cluster_certs / name / "ca.crt").read_bytes() == (
            cluster_certs / "ca.crt"
        ).read_bytes()
    ca = _cert(cluster_certs / "ca.crt")
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca


def test_master_and_agent_certificates_verify_for_local_names_and_given_hosts(
    cluster_certs: Path,
) -> None:
    _verify_server(cluster_certs, "master", "localhost")
    _verify_server(cluster_certs, "master", "master.example")
    _verify_server(cluster_certs, "agent", "localhost")
    san = _cert(cluster_certs / "master" / "tls.crt").extensions.get_extension_for_class(
        x509.SubjectAlternativeName
    )
    assert "127.0.0.1" in {str(ip) for ip in san.value.get_values_for_type(x509.IPAddress)}
    with pytest.raises(VerificationError):
        _verify_server(cluster_certs, "agent", "master.example")  # --host is the master's


def test_a_framework_certificate_cannot_pose_as_a_server(cluster_certs: Path) -> None:
    cert = _cert(cluster_certs / "framework" / "tls.crt")
    usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usages) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    with pytest.raises(VerificationError):
        _verify_server(cluster_certs, "framework", "localhost")


def test_keys_are_private_and_bundles_closed(cluster_certs: Path) -> None:
    keys = [cluster_certs / "ca.key", *cluster_certs.glob("*/tls.key"), cluster_certs / "ci/token"]
    assert len(keys) == 7
    for key in keys:
        assert stat.S_IMODE(key.stat().st_mode) == 0o600, key
    for bundle in ("master", "agent", "workloads", "framework", "admin", "ci"):
        assert stat.S_IMODE((cluster_certs / bundle).stat().st_mode) == 0o700
    assert stat.S_IMODE((cluster_certs / "credentials").stat().st_mode) == 0o600


def test_init_refuses_a_directory_that_has_a_ca(cluster_certs: Path) -> None:
    before = (cluster_certs / "ca.key").read_bytes()
    with pytest.raises(certs.CertificateError, match="already holds a CA"):
        certs.init_cluster(cluster_certs)
    assert (cluster_certs / "ca.key").read_bytes() == before


@pytest.mark.parametrize("name", ["", "..", "a/b", "x" * 65, "-dash", "master"])
def test_bad_principal_names_are_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(certs.CertificateError):
        certs.init_cluster(tmp_path / "c", principals=[name])
    assert not (tmp_path / "c").exists()


def test_issue_adds_a_principal_from_the_same_ca(cluster_certs: Path) -> None:
    bundle = certs.issue(cluster_certs, "agent-2", hosts=["10.1.2.3"])
    _verify_server(cluster_certs, "agent-2", "localhost")
    san = _cert(bundle / "tls.crt").extensions.get_extension_for_class(x509.SubjectAlternativeName)
    assert "10.1.2.3" in {str(ip) for ip in san.value.get_values_for_type(x509.IPAddress)}
    with pytest.raises(certs.CertificateError, match="already holds"):
        certs.issue(cluster_certs, "agent-2")


def test_certs_init_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["certs", "init", str(tmp_path / "c"), "--principal", "team-a", "--token", "ci"])
    assert code == 0
    assert {p.name for p in (tmp_path / "c").iterdir()} == {
        "acls.json",
        "ca.crt",
        "ca.key",
        "credentials",
        "master",
        "agent",
        "workloads",  # the master's built-in job and service frameworks
        "team-a",
        "ci",
    }
    assert "mesolite master --tls-dir" in capsys.readouterr().out
    assert main(["certs", "init", str(tmp_path / "c")]) == 2
    assert "already holds a CA" in capsys.readouterr().err


# A real handshake, in memory ----------------------------------------------------------


def _handshake(server: ssl.SSLContext, client: ssl.SSLContext) -> ssl.SSLObject:
    """Run a TLS handshake between two contexts through memory buffers; returns the server's
    end. Raises ssl.SSLError if either side refuses."""
    s_in, s_out, c_in, c_out = (ssl.MemoryBIO() for _ in range(4))
    server_end = server.wrap_bio(s_in, s_out, server_side=True)
    client_end = client.wrap_bio(c_in, c_out, server_hostname="localhost")
    done = {"server": False, "client": False}
    for _ in range(20):
        for name, end in (("client", client_end), ("server", server_end)):
            if not done[name]:
                try:
                    end.do_handshake()
                    done[name] = True
                except ssl.SSLWantReadError:
                    pass
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if all(done.values()):
            # TLS 1.3: the server checks the client's certificate in its last step; let
            # the client see the verdict.
            with contextlib.suppress(ssl.SSLWantReadError):
                client_end.read(1)
            return server_end
    raise AssertionError("the handshake did not finish")


def test_https_contexts_agree_and_name_the_client(cluster_certs: Path) -> None:
    master = TlsConfig.from_dir(cluster_certs / "master")
    server = master.server_context(require_client_cert=False)
    end = _handshake(server, TlsConfig.from_dir(cluster_certs / "admin").client_context())
    assert principal_of_peercert(end.getpeercert()) == "admin"
    # A token client: no certificate, no principal from TLS (the token must name one).
    end = _handshake(server, TlsConfig.from_dir(cluster_certs / "ci").client_context())
    assert principal_of_peercert(end.getpeercert()) is None


def test_https_refuses_another_cas_certificate_and_requires_one_when_asked(
    cluster_certs: Path, other_certs: Path
) -> None:
    master = TlsConfig.from_dir(cluster_certs / "master")
    stranger = TlsConfig.from_dir(other_certs / "admin").client_context()
    stranger.load_verify_locations(cluster_certs / "ca.crt")  # it trusts our master
    with pytest.raises(ssl.SSLError):
        _handshake(master.server_context(require_client_cert=False), stranger)
    no_cert = TlsConfig(cluster_certs / "ca.crt").client_context()
    with pytest.raises(ssl.SSLError):
        _handshake(master.server_context(require_client_cert=True), no_cert)


def test_a_client_refuses_a_master_from_another_ca(cluster_certs: Path, other_certs: Path) -> None:
    impostor = TlsConfig.from_dir(other_certs / "master").server_context(require_client_cert=False)
    # A client with only the CA (a token client): the impostor does not check it, so only
    # the client's own verification can refuse.
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(impostor, TlsConfig(cluster_certs / "ca.crt").client_context())


def test_principal_of_peercert_takes_one_cn_only() -> None:
    assert principal_of_peercert({"subject": ((("commonName", "a"),),)}) == "a"
    two = {"subject": ((("commonName", "a"),), (("commonName", "b"),))}
    assert principal_of_peercert(two) is None
    assert principal_of_peercert({"subject": ((("organizationName", "a"),),)}) is None
    assert principal_of_peercert({}) is None
    assert principal_of_peercert(None) is None


# Bearer tokens ------------------------------------------------------------------------


def test_the_credentials_file_holds_hashes_and_names_the_holder(cluster_certs: Path) -> None:
    token = (cluster_certs / "ci" / "token").read_text().strip()
    text = (cluster_certs / "credentials").read_text()
    assert token not in text
    known = credentials.load(cluster_certs / "credentials")
    assert known.principal_of(token) == "ci"
    assert known.principal_of(token + "x") is None
    assert known.principal_of("") is None


def test_certs_token_adds_a_principal(tmp_path: Path) -> None:
    certs.init_cluster(tmp_path / "c", tokens=["ci"])
    certs.add_tokens(tmp_path / "c", ["ops"])
    known = credentials.load(tmp_path / "c" / "credentials")
    assert known.principals == {"ci", "ops"}
    ops = (tmp_path / "c" / "ops" / "token").read_text().strip()
    assert known.principal_of(ops) == "ops"
    with pytest.raises(certs.CertificateError, match="already has a token"):
        certs.add_tokens(tmp_path / "c", ["ops"])


@pytest.mark.parametrize(
    "text",
    [
        "ci abc",
        "ci sha256:" + "0" * 63,
        "ci sha256:" + "G" * 64,
        "ci sha256:" + "0" * 64 + " extra",
        f"ci sha256:{'0' * 64}\nci sha256:{'1' * 64}",
    ],
)
def test_bad_credentials_files_are_refused_with_the_line(text: str) -> None:
    with pytest.raises(credentials.CredentialsError, match="creds:"):
        credentials.parse(text, "creds")


def test_comments_and_blank_lines_are_ignored() -> None:
    parsed = credentials.parse(f"# team tokens\n\nci sha256:{'a' * 64}  # the CI\n")
    assert parsed.principals == {"ci"}


@pytest.mark.parametrize(
    ("header", "token"),
    [
        ("Bearer abc-_.~+/=", "abc-_.~+/="),
        ("bearer abc", "abc"),
        ("Basic abc", None),
        ("Bearer", None),
        ("Bearer a b", None),
        ("Bearer " + "a" * 600, None),
        (None, None),
    ],
)
def test_bearer_header(header: str | None, token: str | None) -> None:
    assert credentials.bearer_token(header) == token


# Options and environment --------------------------------------------------------------


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    tls_options.add_client_options(parser)
    return parser.parse_args(argv)


def test_tls_dir_from_the_flag_or_else_the_environment(cluster_certs: Path) -> None:
    env = {"MESOLITE_TLS_DIR": str(cluster_certs / "framework")}
    assert tls_options.client_auth(_args(), env).tls == TlsConfig.from_dir(
        cluster_certs / "framework"
    )
    flag = tls_options.client_auth(_args("--tls-dir", str(cluster_certs / "admin")), env)
    assert flag.tls == TlsConfig.from_dir(cluster_certs / "admin")
    assert tls_options.client_auth(_args(), {}) == tls_options.ClientAuth()


def test_a_token_bundle_gives_the_token_and_the_ca(cluster_certs: Path) -> None:
    auth = tls_options.client_auth(_args("--tls-dir", str(cluster_certs / "ci")), {})
    assert auth.tls == TlsConfig(cluster_certs / "ci" / "ca.crt")
    assert auth.token == (cluster_certs / "ci" / "token").read_text().strip()
    assert auth.token not in repr(auth)
    env = {"MESOLITE_TOKEN": "from-env"}
    assert tls_options.client_auth(_args("--tls-dir", str(cluster_certs / "ci")), env).token == (
        "from-env"
    )


def test_no_token_over_plaintext(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("t\n")
    with pytest.raises(TlsError, match="only over TLS"):
        tls_options.client_auth(_args("--token-file", str(tmp_path / "token")), {})
    with pytest.raises(TlsError, match="only over TLS"):
        tls_options.client_auth(_args(), {"MESOLITE_TOKEN": "t"})


def test_files_named_one_by_one(cluster_certs: Path) -> None:
    b = cluster_certs / "admin"
    files = ("--ca", str(b / "ca.crt"), "--cert", str(b / "tls.crt"), "--key", str(b / "tls.key"))
    args = _args(*files)
    assert tls_options.client_auth(args, {}).tls == TlsConfig.from_dir(b)
    with pytest.raises(TlsError):
        tls_options.client_auth(_args("--cert", str(b / "tls.crt")), {})
    with pytest.raises(TlsError):
        TlsConfig(b / "ca.crt", b / "tls.crt")


def test_a_directory_without_a_ca_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TlsError, match=r"no ca\.crt"):
        TlsConfig.from_dir(tmp_path)


# Secure by default --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.0.2", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("", False),
        ("10.0.0.1", False),
    ],
)
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_check_listen_refuses_the_network_without_tls_unless_insecure() -> None:
    check_listen("x", "127.0.0.1", tls=False, insecure=False)
    check_listen("x", "0.0.0.0", tls=True, insecure=False)
    with pytest.raises(TlsError, match="--insecure"):
        check_listen("x", "0.0.0.0", tls=False, insecure=False)
    check_listen("x", "0.0.0.0", tls=False, insecure=True)


def test_secret_files_are_never_group_readable(tmp_path: Path) -> None:
    old = os.umask(0)  # even with a permissive umask
    try:
        certs.init_cluster(tmp_path / "c")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "c" / "agent" / "tls.key").stat().st_mode) == 0o600


def test_certs_init_writes_starter_acls_that_keep_each_principal_to_its_part(
    tmp_path: Path,
) -> None:
    """With TLS and no ACL file every authenticated principal may do everything (an
    outside review registered a framework's certificate as an agent): `certs init`
    writes ACLs to start from."""
    from mesolite.master.acl import Action, load_acls

    certs.init_cluster(tmp_path / "c", principals=["framework", "admin"], tokens=["ci"])
    acls = load_acls(tmp_path / "c" / "acls.json")
    assert acls.allows(Action.REGISTER_AGENTS, "agent")
    for principal in ("framework", "admin", "ci", None):
        assert not acls.allows(Action.REGISTER_AGENTS, principal)
    assert not acls.allows(Action.REGISTER_FRAMEWORKS, "agent", "*")
    assert acls.allows(Action.REGISTER_FRAMEWORKS, "framework", "any/role")
    assert acls.allows(Action.VIEW_STATE, "ci") and not acls.allows(Action.VIEW_STATE, "agent")
    assert acls.allows(Action.ACCESS_SANDBOXES, "admin", "framework")
    # A framework may run its tasks as the user of its principal's name, no other.
    assert acls.allows(Action.RUN_TASKS, "framework", "framework")
    for user in ("admin", "root", "nobody"):
        assert not acls.allows(Action.RUN_TASKS, "framework", user)
    assert not acls.allows(Action.RUN_TASKS, "agent", "agent")
    assert acls.allows(Action.ACCESS_SANDBOXES, "framework", "framework")
    assert not acls.allows(Action.ACCESS_SANDBOXES, "framework", "ci")
    for action in (Action.TEARDOWN_FRAMEWORKS, Action.KILL_TASKS):
        assert acls.allows(action, "admin", "ci") and acls.allows(action, "ci", "ci")
        assert not acls.allows(action, "framework", "ci") and not acls.allows(action, None, "ci")
    # The master's built-in workloads register their frameworks in any role, and do
    # nothing else; admin reads their tasks' output and may tear them down.
    assert acls.allows(Action.REGISTER_FRAMEWORKS, "workloads", "any/role")
    assert not acls.allows(Action.VIEW_STATE, "workloads")
    assert not acls.allows(Action.REGISTER_AGENTS, "workloads")
    assert acls.allows(Action.ACCESS_SANDBOXES, "admin", "workloads")
    assert acls.allows(Action.TEARDOWN_FRAMEWORKS, "admin", "workloads")
    assert not acls.allows(Action.TEARDOWN_FRAMEWORKS, "framework", "workloads")
    assert not acls.allows(Action.RUN_TASKS, "workloads", "workloads")
