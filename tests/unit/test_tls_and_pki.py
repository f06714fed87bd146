"""TLS without sockets: the loopback check, the node configuration's TLS
rules, the certificates raftsched.pki makes, and the contexts built from
them, shaking hands in memory (ssl.MemoryBIO)."""

from __future__ import annotations

import dataclasses
import ipaddress
import ssl
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from raftsched import pki, tls
from raftsched.client import client_ssl_context
from raftsched.config import ConfigError, NodeConfig, Peer, is_loopback_host
from raftsched.testing import make_cluster_tls


@pytest.mark.parametrize(
    "host", ["127.0.0.1", "127.0.0.2", "127.255.255.254", "::1", "[::1]", "localhost", "LocalHost"]
)
def test_loopback_hosts(host: str) -> None:
    assert is_loopback_host(host)


@pytest.mark.parametrize(
    "host", ["0.0.0.0", "::", "", "10.0.0.11", "192.168.1.2", "::ffff:10.0.0.1", "n1", "a.example"]
)
def test_hosts_that_are_not_loopback(host: str) -> None:
    assert not is_loopback_host(host)


def config(host: str = "127.0.0.1", **changes: object) -> NodeConfig:
    base = NodeConfig(
        node_id="n1", data_dir=Path("d"), http_host=host, http_port=8701,
        raft_address="127.0.0.1:9701", secret="s" * 24,
    )  # fmt: skip
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


CERT = {"tls_cert_file": Path("c.pem"), "tls_key_file": Path("k.pem")}


def test_clear_text_off_loopback_is_refused_unless_insecure_http_is_said() -> None:
    config().validate()
    with pytest.raises(ConfigError, match="0.0.0.0:8701 is not a loopback address"):
        config("0.0.0.0").validate()
    config("0.0.0.0", insecure_http=True).validate()
    config("0.0.0.0", **CERT).validate()


def test_a_node_with_tls_advertises_and_needs_https() -> None:
    assert config().advertised_http_url == "http://127.0.0.1:8701"
    assert config(**CERT).advertised_http_url == "https://127.0.0.1:8701"
    assert config("::1", **CERT).advertised_http_url == "https://[::1]:8701"
    with pytest.raises(ConfigError, match="--http-url is 'http://h:1'"):
        config(**CERT, http_url="http://h:1").validate()
    peer = Peer("n2", "127.0.0.1:9702", "http://127.0.0.1:8702")
    with pytest.raises(ConfigError, match="peer n2 is 'http://127.0.0.1:8702'"):
        config(**CERT, peers=(peer,)).validate()
    config(**CERT, peers=(dataclasses.replace(peer, http_url="https://h:8702"),)).validate()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"tls_cert_file": Path("c.pem")}, "--tls-cert and --tls-key go together"),
        ({"tls_key_file": Path("k.pem")}, "--tls-cert and --tls-key go together"),
        ({"tls_client_ca_file": Path("ca.pem")}, "--tls-client-ca needs --tls-cert"),
        ({"tls_ca_file": Path("ca.pem")}, "--tls-ca needs --tls-cert"),
    ],
)
def test_incomplete_tls_settings_are_refused(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        config(**changes).validate()


def test_a_node_certificate_names_its_hosts_and_serves_and_acts_as_client() -> None:
    authority = pki.CertificateAuthority.create("test CA")
    issued = authority.issue("n1", ["10.0.0.11", "n1.internal", "::1", "10.0.0.11"])
    certificate = x509.load_pem_x509_certificate(issued.cert_pem)
    names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.IPAddress) == [
        ipaddress.ip_address("10.0.0.11"),
        ipaddress.ip_address("::1"),
    ]
    assert names.get_values_for_type(x509.DNSName) == ["n1.internal"]
    usages = certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(usages) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    assert certificate.issuer == authority.certificate.subject
    certificate.verify_directly_issued_by(authority.certificate)
    ca = authority.certificate.extensions.get_extension_for_class(x509.BasicConstraints).value
    assert ca.ca and ca.path_length == 0


def test_dev_certificates_keep_the_ca_and_renew_node_certificates(tmp_path: Path) -> None:
    first = pki.dev_certificates(tmp_path, ["n1", "n2"], ["127.0.0.1"])
    ca_before = first.ca_file.read_bytes()
    node_before = first.nodes["n1"][0].read_bytes()
    for key in [tmp_path / "ca.key", *(key for _, key in first.nodes.values())]:
        assert key.stat().st_mode & 0o777 == 0o600, key
    second = pki.dev_certificates(tmp_path, ["n1", "n2"], ["127.0.0.1"])
    assert second.ca_file.read_bytes() == ca_before
    assert second.nodes["n1"][0].read_bytes() != node_before
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "ca.key", "ca.pem", "n1.key", "n1.pem", "n2.key", "n2.pem",
    ]  # fmt: skip


def handshake(server: ssl.SSLContext, client: ssl.SSLContext, hostname: str) -> ssl.SSLObject:
    """A full TLS handshake in memory; the server's side, or SSLError."""
    server_in, server_out, client_in, client_out = (ssl.MemoryBIO() for _ in range(4))
    server_side = server.wrap_bio(server_in, server_out, server_side=True)
    client_side = client.wrap_bio(client_in, client_out, server_hostname=hostname)
    done = {"server": False, "client": False}
    for _ in range(20):
        for name, side in (("client", client_side), ("server", server_side)):
            if not done[name]:
                try:
                    side.do_handshake()
                    done[name] = True
                except ssl.SSLWantReadError:
                    pass
        server_in.write(client_out.read())
        client_in.write(server_out.read())
        if all(done.values()):
            # With TLS 1.3 the server judges the client's certificate after
            # the client thinks it is done: a read makes the verdict show.
            client_side.write(b"ping")
            server_in.write(client_out.read())
            assert server_side.read(4) == b"ping"
            return server_side
    raise AssertionError("the handshake did not finish")


def node_config(tmp_path: Path, *, mutual: bool) -> tuple[NodeConfig, Path, Path, Path]:
    files = make_cluster_tls(tmp_path, mutual=mutual)
    node = config(
        tls_cert_file=files.node_cert_file,
        tls_key_file=files.node_key_file,
        tls_client_ca_file=files.ca_file if mutual else None,
    )
    return node, files.ca_file, files.client_cert_file, files.client_key_file


def test_server_and_client_contexts_shake_hands(tmp_path: Path) -> None:
    node, ca_file, _, _ = node_config(tmp_path, mutual=False)
    server = tls.server_context(node)
    assert server is not None and server.minimum_version == ssl.TLSVersion.TLSv1_2
    assert server.verify_mode == ssl.CERT_NONE
    client = client_ssl_context(ca_file)
    assert client is not None and client.minimum_version == ssl.TLSVersion.TLSv1_2
    handshake(server, client, "127.0.0.1")
    handshake(server, client, "localhost")
    with pytest.raises(ssl.SSLCertVerificationError, match="mismatch"):
        handshake(server, client, "10.9.9.9")
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(server, ssl.create_default_context(), "127.0.0.1")  # not the system's CA
    assert tls.server_context(config()) is None and tls.peer_context(config()) is None


def test_mutual_tls_wants_a_certificate_and_peers_show_theirs(tmp_path: Path) -> None:
    node, ca_file, client_cert, client_key = node_config(tmp_path, mutual=True)
    server = tls.server_context(node)
    assert server is not None and server.verify_mode == ssl.CERT_REQUIRED
    anonymous = client_ssl_context(ca_file)
    assert anonymous is not None
    with pytest.raises(ssl.SSLError, match="CERTIFICATE_REQUIRED|PEER_DID_NOT_RETURN"):
        handshake(server, anonymous, "127.0.0.1")
    with_certificate = client_ssl_context(ca_file, client_cert, client_key)
    assert with_certificate is not None
    accepted = handshake(server, with_certificate, "127.0.0.1")
    assert accepted.getpeercert() is not None
    # A node calling a peer verifies it with the client CA (no --tls-ca
    # given) and shows its own certificate, which the peer accepts.
    peer = tls.peer_context(node)
    assert peer is not None and peer.verify_mode == ssl.CERT_REQUIRED
    assert handshake(server, peer, "127.0.0.1").getpeercert() is not None


def test_files_that_do_not_load_are_configuration_errors(tmp_path: Path) -> None:
    node, ca_file, client_cert, client_key = node_config(tmp_path, mutual=False)
    with pytest.raises(ConfigError, match="cannot load --tls-cert"):
        tls.server_context(dataclasses.replace(node, tls_key_file=client_key))
    with pytest.raises(ConfigError, match="cannot load --tls-cert"):
        tls.server_context(dataclasses.replace(node, tls_cert_file=tmp_path / "missing.pem"))
    with pytest.raises(ConfigError, match="cannot load --tls-ca"):
        tls.peer_context(dataclasses.replace(node, tls_ca_file=client_key))
    with pytest.raises(ValueError, match="cannot load TLS files"):
        client_ssl_context(tmp_path / "missing.pem")
    with pytest.raises(ValueError, match="needs its client certificate"):
        client_ssl_context(ca_file, client_key=client_key)
    assert client_ssl_context() is None
    assert client_ssl_context(client_cert=client_cert, client_key=client_key) is not None


def test_the_client_context_takes_the_files_the_environment_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node, ca_file, client_cert, client_key = node_config(tmp_path, mutual=True)
    server = tls.server_context(node)
    assert server is not None
    monkeypatch.setenv("RAFTSCHED_CA_FILE", str(ca_file))
    monkeypatch.setenv("RAFTSCHED_CLIENT_CERT", str(client_cert))
    monkeypatch.setenv("RAFTSCHED_CLIENT_KEY", str(client_key))
    from_env = client_ssl_context()
    assert from_env is not None
    assert handshake(server, from_env, "127.0.0.1").getpeercert() is not None
    # "" turns a file off; a file given wins over the environment's.
    anonymous = client_ssl_context(client_cert="", client_key="")
    assert anonymous is not None
    with pytest.raises(ssl.SSLError, match="CERTIFICATE_REQUIRED|PEER_DID_NOT_RETURN"):
        handshake(server, anonymous, "127.0.0.1")
    with pytest.raises(ValueError, match="cannot load TLS files"):
        client_ssl_context(ca_file=tmp_path / "missing.pem")
    monkeypatch.setenv("RAFTSCHED_CLIENT_KEY", "")
    with pytest.raises(ValueError, match="cannot load TLS files"):
        client_ssl_context()  # the certificate without its key does not load
