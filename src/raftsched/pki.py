"""A small certificate authority for development and tests (`raftsched dev
--tls`, tests/e2e/test_tls.py), made with the `cryptography` library.

Not for production: a real deployment gets its certificates from its own PKI
(docs/security.md). Keys are ECDSA P-256, signatures SHA-256. A node
certificate names its hosts as subject alternative names (IP addresses as
IPs, anything else as DNS names) and may serve and act as a client both:
nodes present it to peers that require client certificates.

Private keys are written mode 0600, created so from the start (never
world-readable, not even for an instant).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_VALID_DAYS = 3650
LEAF_VALID_DAYS = 397  # what browsers accept for a server certificate
# A certificate is valid from a little before it was made: a peer whose clock
# is slightly behind must not see it as not yet valid.
BACKDATE = datetime.timedelta(minutes=5)


@dataclass(frozen=True, slots=True)
class Issued:
    """A certificate and its private key, both PEM."""

    cert_pem: bytes
    key_pem: bytes

    def write(self, cert_path: Path, key_path: Path) -> None:
        write_public(cert_path, self.cert_pem)
        write_private(key_path, self.key_pem)


class CertificateAuthority:
    """A self-signed CA that issues node and client certificates."""

    def __init__(self, key: ec.EllipticCurvePrivateKey, certificate: x509.Certificate) -> None:
        self.key = key
        self.certificate = certificate

    @classmethod
    def create(cls, common_name: str = "raftsched dev CA") -> CertificateAuthority:
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        now = datetime.datetime.now(datetime.UTC)
        certificate = (
            _builder(name, name, key.public_key(), now, CA_VALID_DAYS)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )  # fmt: skip
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
            .sign(key, hashes.SHA256())
        )
        return cls(key, certificate)

    @classmethod
    def load(cls, cert_path: Path, key_path: Path) -> CertificateAuthority:
        certificate = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ValueError(f"{key_path} is not an EC key made by raftsched.pki")
        return cls(key, certificate)

    @property
    def cert_pem(self) -> bytes:
        return self.certificate.public_bytes(serialization.Encoding.PEM)

    @property
    def key_pem(self) -> bytes:
        return _key_pem(self.key)

    def issue(self, common_name: str, hosts: Sequence[str] = ()) -> Issued:
        """A leaf certificate for `common_name`, valid for `hosts` (none: a
        client certificate only names its holder)."""
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        now = datetime.datetime.now(datetime.UTC)
        builder = (
            _builder(subject, self.certificate.subject, key.public_key(), now, LEAF_VALID_DAYS)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), False
            )
        )
        if hosts:
            names = [_general_name(host) for host in dict.fromkeys(hosts)]
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        certificate = builder.sign(self.key, hashes.SHA256())
        return Issued(certificate.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def _builder(
    subject: x509.Name,
    issuer: x509.Name,
    public_key: ec.EllipticCurvePublicKey,
    now: datetime.datetime,
    valid_days: int,
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + datetime.timedelta(days=valid_days))
    )


def _general_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host.strip("[]")))
    except ValueError:
        return x509.DNSName(host)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def write_private(path: Path, data: bytes) -> None:
    """Write a key file, mode 0600 from its creation, replacing any old one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    temporary.unlink(missing_ok=True)
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(data)
    temporary.replace(path)


def write_public(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_bytes(data)
    temporary.replace(path)


@dataclass(frozen=True, slots=True)
class DevTls:
    """Where `dev_certificates` put things: the CA bundle and, per node id,
    its (certificate, key) paths."""

    ca_file: Path
    nodes: dict[str, tuple[Path, Path]]


def dev_certificates(directory: Path, node_ids: Sequence[str], hosts: Sequence[str]) -> DevTls:
    """A local CA in `directory` (made once, then reused, so that a CA file a
    person already trusts stays valid) and a fresh certificate for each node,
    valid for `hosts` and the loopback names."""
    ca_file, ca_key = directory / "ca.pem", directory / "ca.key"
    if ca_file.exists() and ca_key.exists():
        authority = CertificateAuthority.load(ca_file, ca_key)
    else:
        authority = CertificateAuthority.create()
        write_private(ca_key, authority.key_pem)
        write_public(ca_file, authority.cert_pem)
    names = [*hosts, "localhost", "127.0.0.1", "::1"]
    nodes = {}
    for node_id in node_ids:
        paths = (directory / f"{node_id}.pem", directory / f"{node_id}.key")
        authority.issue(node_id, names).write(*paths)
        nodes[node_id] = paths
    return DevTls(ca_file, nodes)
