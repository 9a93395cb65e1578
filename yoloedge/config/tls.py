"""The one place that turns `mqtt.tls` into the `ssl.SSLContext` the MQTT client connects with.

`yoloedge check`, start-up and a reload call `client_context` while loading the file, and the MQTT
client calls it again when it connects, so a CA, certificate or key that exists but is not what it
claims (a DER file, an empty file, a key given as the CA, a certificate without its key, an
encrypted key) is refused as a configuration error with its line, never first found by the
running daemon. It lives in `config` because `publish` imports `config`, not the other way round.

Encrypted keys are refused: a service has nobody to type the passphrase, and OpenSSL's fallback
would prompt on the terminal.
"""

from __future__ import annotations

import ssl

from ..errors import YoloedgeError
from .schema import TlsConfig

#: what OpenSSL's "no certificate found" means for the operator, and the fix for the usual cause.
_NO_PEM_CERT = ("holds no PEM certificate (a DER file, an empty file or a key?); a DER certificate "
                "converts with `openssl x509 -inform der -in FILE -out FILE.pem`")


class TlsMaterialError(YoloedgeError):
    """A TLS file cannot be used; `key` is the `mqtt.tls` key that names it."""

    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.key = key
        self.message = message


class _EncryptedKey(Exception):
    """Raised by the password callback: OpenSSL asks for a password only for an encrypted key."""


def _refuse_password() -> str:
    raise _EncryptedKey()


def client_context(tls: TlsConfig) -> ssl.SSLContext:
    """A client context as the MQTT connection uses it: the system CAs unless `ca_certs` names a
    PEM bundle, the client certificate and key when given, and host names checked unless
    `insecure`. Raises TlsMaterialError naming the key whose file is wrong."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if tls.certfile:
        _load_client_certificate(context, tls.certfile, tls.keyfile)
    context.verify_mode = ssl.CERT_REQUIRED
    if tls.ca_certs:
        _load_ca(context, tls.ca_certs)
    else:
        context.load_default_certs()
    if tls.insecure:
        context.check_hostname = False
    return context


def _load_ca(context: ssl.SSLContext, path: str) -> None:
    try:
        context.load_verify_locations(cafile=path)
    except ssl.SSLError:
        raise TlsMaterialError("ca_certs", f"{path} {_NO_PEM_CERT}") from None
    except OSError as exc:
        raise TlsMaterialError("ca_certs", f"cannot read {path}: {exc.strerror or exc}") from None
    if not context.cert_store_stats().get("x509"):
        raise TlsMaterialError("ca_certs", f"{path} {_NO_PEM_CERT}")


def _load_client_certificate(context: ssl.SSLContext, certfile: str, keyfile: str | None) -> None:
    try:
        context.load_cert_chain(certfile, keyfile, password=_refuse_password)
    except _EncryptedKey:
        raise TlsMaterialError("keyfile" if keyfile else "certfile",
                               f"{keyfile or certfile}: the private key is encrypted; the service cannot type "
                               f"its passphrase (decrypt it: `openssl pkey -in KEY -out KEY.plain`)") from None
    except ssl.SSLError as exc:
        raise _chain_error(certfile, keyfile, exc) from None
    except OSError as exc:
        key = "certfile" if keyfile is None or exc.filename == certfile else "keyfile"
        raise TlsMaterialError(key, f"cannot read {exc.filename or certfile}: {exc.strerror or exc}") from None


def _chain_error(certfile: str, keyfile: str | None, exc: ssl.SSLError) -> TlsMaterialError:
    """OpenSSL says "PEM lib" for most failures; find out which file is at fault."""
    if exc.reason == "KEY_VALUES_MISMATCH":
        return TlsMaterialError("keyfile" if keyfile else "certfile",
                                f"{keyfile or certfile}: the private key does not belong to the certificate "
                                f"in {certfile}")
    if not _has_pem_certificate(certfile):
        return TlsMaterialError("certfile", f"{certfile} {_NO_PEM_CERT}")
    if keyfile is None:
        return TlsMaterialError("certfile", f"{certfile} holds no private key; name it with keyfile")
    return TlsMaterialError("keyfile", f"{keyfile} holds no PEM private key (a DER file, an empty file "
                                       f"or a certificate?)")


def _has_pem_certificate(path: str) -> bool:
    probe = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        probe.load_verify_locations(cafile=path)
    except (ssl.SSLError, OSError):
        return False
    return bool(probe.cert_store_stats().get("x509"))
