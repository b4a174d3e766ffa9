"""The deployment's C2PA signing credentials: loaded from CHORUS_C2PA_CERT and
CHORUS_C2PA_KEY, or made once in the data folder where neither is set.

c2pa-rs refuses a self-signed end-entity certificate, so what is made here is a
small chain: a CA of this deployment, and a signing certificate it issued with
the key usage (digitalSignature) and extended key usage (emailProtection) that
the C2PA certificate profile asks for. Readers trust it only where they are told
to (our verifier trusts the deployment's own CA); a production deployment uses
a certificate from a CA that C2PA readers know.
"""

from __future__ import annotations

import datetime
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from chorus.private_files import PRIVATE_FILE_MODE, PRIVATE_FOLDER_MODE

log = logging.getLogger(__name__)

CERT_FILE = "chain.pem"  # the signing certificate, then its CA
KEY_FILE = "key.pem"


@dataclass(frozen=True)
class Credentials:
    chain_pem: bytes  # end-entity certificate first, then the certificates above it
    key_pem: bytes

    @property
    def anchor_pem(self) -> bytes:
        """The chain's last certificate: what our own verifier trusts."""
        certs = x509.load_pem_x509_certificates(self.chain_pem)
        return certs[-1].public_bytes(serialization.Encoding.PEM)


def load_credentials(*, cert: Path, key: Path) -> Credentials:
    return Credentials(chain_pem=cert.read_bytes(), key_pem=key.read_bytes())


def ensure_self_signed(folder: Path, *, organization: str = "Chorus") -> bool:
    """Make a CA and a signing certificate in `folder` unless it holds them;
    True when they were made now. Two processes starting at once keep one pair:
    each writes a folder of its own and renames it into place (the rename of
    the second fails on the folder already there)."""
    if (folder / CERT_FILE).exists() and (folder / KEY_FILE).exists():
        return False
    chain, key = make_chain(organization=organization)
    folder.parent.mkdir(mode=PRIVATE_FOLDER_MODE, parents=True, exist_ok=True)
    scratch = folder.with_name(f"{folder.name}.{os.getpid()}.tmp")
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(mode=PRIVATE_FOLDER_MODE)
    for name, data in ((CERT_FILE, chain), (KEY_FILE, key)):
        descriptor = os.open(
            scratch / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE_MODE
        )
        with os.fdopen(descriptor, "wb") as out:
            out.write(data)
    try:
        scratch.rename(folder)
    except OSError:  # another process made it first
        shutil.rmtree(scratch, ignore_errors=True)
        return False
    log.warning(
        "made a self-signed C2PA signing certificate in %s; set CHORUS_C2PA_CERT and "
        "CHORUS_C2PA_KEY to a certificate from a CA that readers trust in production",
        folder,
    )
    return True


def make_chain(
    *, organization: str = "Chorus", days: int = 3650, eku: bool = True
) -> tuple[bytes, bytes]:
    """(chain PEM: signing certificate then CA, signing key PEM), ES256 (P-256)."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name(f"{organization} C2PA CA", organization)
    ca = (
        _builder(ca_name, ca_name, ca_key.public_key(), now, days)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_usage(sign=False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (
        _builder(
            _name(f"{organization} signer", organization), ca_name, key.public_key(), now, days
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_usage(sign=True), critical=True)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
    )
    if eku:
        builder = builder.add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.EMAIL_PROTECTION]), critical=False
        )
    leaf = builder.sign(ca_key, hashes.SHA256())
    pem = serialization.Encoding.PEM
    key_pem = key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return leaf.public_bytes(pem) + ca.public_bytes(pem), key_pem


def _name(common_name: str, organization: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization),
        ]
    )


def _builder(
    subject: x509.Name,
    issuer: x509.Name,
    public_key: ec.EllipticCurvePublicKey,
    now: datetime.datetime,
    days: int,
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
    )


def _usage(*, sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=sign,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=not sign,
        crl_sign=not sign,
        encipher_only=False,
        decipher_only=False,
    )
