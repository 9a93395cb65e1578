"""Real TLS files for config tests, made with the openssl command: good ones, and files that exist
but are not what they claim (DER, empty, a key in place of a certificate, an encrypted key)."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class TlsFiles:
    cert: Path  # PEM, self-signed: also a usable CA file
    key: Path  # its unencrypted PEM key
    der: Path  # the same certificate in DER
    empty: Path
    encrypted_key: Path  # the key, encrypted with a passphrase
    other_key: Path  # a key that does not belong to `cert`
    cert_and_key: Path  # certificate and key in one PEM file


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def make_tls_files(folder: Path) -> TlsFiles:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    folder.mkdir(parents=True, exist_ok=True)
    files = TlsFiles(folder / "cert.pem", folder / "key.pem", folder / "cert.der", folder / "empty.pem",
                     folder / "encrypted.pem", folder / "other.key", folder / "both.pem")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(files.key), "-out", str(files.cert),
             "-days", "2", "-subj", "/CN=yoloedge-test")
    _openssl("x509", "-in", str(files.cert), "-outform", "DER", "-out", str(files.der))
    _openssl("pkey", "-in", str(files.key), "-aes256", "-passout", "pass:secret", "-out", str(files.encrypted_key))
    _openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", str(files.other_key))
    files.empty.write_bytes(b"")
    files.cert_and_key.write_bytes(files.cert.read_bytes() + files.key.read_bytes())
    return files
