"""Makes a deployment's egress CA: the one the egress proxy ends TLS with to add a secret bound
to a host, and that sandboxes with a network policy trust.

    python -m tools.egress_ca DIR    # DIR/egress-ca.pem (key + certificate, 0600: the proxy's)
                                     # DIR/egress-ca.crt (certificate only: the runtime's)

`make up` makes one into .run/credentials once; on Kubernetes, make one and keep it in the Secret
`deckhands-egress-ca` (docs/deployment.md). Kept files are left as they are.
"""

from __future__ import annotations

import datetime
import ipaddress
import sys
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tools.api_access import write_secret

__all__ = ["CA_CERT", "CA_FILE", "ensure_egress_ca", "issue", "new_ca"]

CA_FILE = "egress-ca.pem"
CA_CERT = "egress-ca.crt"
_DAYS = 3650


def _pem_key(key: rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )


def new_ca(name: str = "deckhands egress CA") -> tuple[bytes, bytes]:
    """(private key + certificate, certificate), both PEM."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    pem = cert.public_bytes(serialization.Encoding.PEM)
    return _pem_key(key) + pem, pem


def issue(ca_pem: bytes, hosts: list[str]) -> tuple[bytes, bytes]:
    """A server's (private key, certificate chain) for `hosts` (names or addresses), signed by
    the CA in `ca_pem` (key + certificate): for test servers."""
    ca_key = serialization.load_pem_private_key(ca_pem, None)
    assert isinstance(ca_key, rsa.RSAPrivateKey)
    ca_cert = x509.load_pem_x509_certificate(ca_pem)
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return _pem_key(key), cert.public_bytes(serialization.Encoding.PEM)


def ensure_egress_ca(directory: Path) -> tuple[Path, Path]:
    """(the proxy's file, the runtime's certificate) in `directory`, made if missing."""
    ca_file, ca_cert = directory / CA_FILE, directory / CA_CERT
    if not ca_file.is_file() or not ca_cert.is_file():
        directory.mkdir(parents=True, exist_ok=True)
        both, cert = new_ca()
        write_secret(ca_file, both.decode())
        ca_cert.write_bytes(cert)
        ca_cert.chmod(0o644)
    return ca_file, ca_cert


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m tools.egress_ca DIR")
    made = ensure_egress_ca(Path(sys.argv[1]))
    print(f"{made[0]} (the egress proxy's DECKHANDS_EGRESS_CA_FILE)")
    print(f"{made[1]} (the runtime's DECKHANDS_EGRESS_CA_CERT)")
