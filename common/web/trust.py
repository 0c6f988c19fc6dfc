"""Whom a fetch trusts: the certificate authorities libcurl checks a site's certificate against.

* Default: certifi's roots (the same on every machine and in the image; the system's store
  differs between them).
* FETCH_CA_BUNDLE: a PEM file, or a directory whose ``*.pem``/``*.crt``/``*.cer`` files are
  read in name order: a private CA, a staging site's, a TLS-inspecting proxy's. FETCH_CA_MODE
  ``add`` (the default) trusts them besides certifi's roots; ``replace`` trusts only them.
* SSL_CERT_FILE, OpenSSL's own variable, read from the process's environment as OpenSSL reads
  it (it is not a setting: compose does not carry a host's path into a container, local mode
  does not keep it): its file replaces certifi's roots as the default roots, which
  FETCH_CA_BUNDLE then adds to or replaces.

libcurl takes one CA file (CAINFO; CAPATH wants OpenSSL's hashed names), so ``add`` and a
directory are written once per process into one file of this process's own (mode 0600, removed
at exit), which every easy handle then uses. A bundle that cannot be read or holds no
certificate stops the process at start (:class:`ConfigError`), naming the variable, rather
than failing every HTTPS fetch later.

FETCH_INSECURE_DOMAINS turns the checks off for the hosts it names (and their subdomains): the
explicit, loud escape hatch. Each process warns at start; each such response's record says
``tls_verified: false``.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import tempfile
import threading
from pathlib import Path

import certifi

from common.core.config import Settings
from common.core.errors import ConfigError

logger = logging.getLogger(__name__)

PEM_SUFFIXES = (".pem", ".crt", ".cer")
_BEGIN = b"-----BEGIN CERTIFICATE-----"

_lock = threading.Lock()
_files: dict[tuple[str, str, str], str] = {}  # (bundle, mode, ssl_cert_file) -> CA file
_warned: set[tuple[str, ...]] = set()


def ca_file(settings: Settings) -> str:
    """The CA file every fetch of this process uses (built once per distinct setting).

    Raises:
        ConfigError: FETCH_CA_BUNDLE or SSL_CERT_FILE cannot be read or holds no certificate.
    """
    key = (settings.fetch_ca_bundle, settings.fetch_ca_mode, os.environ.get("SSL_CERT_FILE", ""))
    with _lock:
        found = _files.get(key)
        if found is None:
            found = _files[key] = _build(*key)
        if settings.fetch_insecure_domains and settings.fetch_insecure_domains not in _warned:
            _warned.add(settings.fetch_insecure_domains)
            logger.warning("FETCH_INSECURE_DOMAINS: certificates of %s and their subdomains "
                           "are NOT checked: anyone on the path can read and change those "
                           "pages", ", ".join(settings.fetch_insecure_domains))
    return found


def insecure(settings: Settings, host: str | None) -> bool:
    """Whether ``host`` is fetched without checking its certificate (FETCH_INSECURE_DOMAINS)."""
    if not host or not settings.fetch_insecure_domains:
        return False
    host = host.lower().rstrip(".")
    return any(host == d or host.endswith("." + d) for d in settings.fetch_insecure_domains)


def _build(bundle: str, mode: str, ssl_cert_file: str) -> str:
    roots = certifi.where()  # the default roots: certifi's, or SSL_CERT_FILE's as OpenSSL does
    if ssl_cert_file:
        if Path(ssl_cert_file).is_dir():
            raise ConfigError(f"SSL_CERT_FILE={ssl_cert_file!r} is a directory: name a "
                              "PEM file, or give the directory as FETCH_CA_BUNDLE")
        _certificates(Path(ssl_cert_file), "SSL_CERT_FILE")  # readable, and has one
        roots = ssl_cert_file
    if not bundle:
        return roots
    pems = _certificates(Path(bundle), "FETCH_CA_BUNDLE")
    if mode == "replace" and Path(bundle).is_file():
        return bundle
    parts = [Path(roots).read_bytes()] if mode == "add" else []
    parts.extend(pems)
    handle, path = tempfile.mkstemp(prefix="scrape-fleet-ca-", suffix=".pem")
    with os.fdopen(handle, "wb") as out:
        out.write(b"\n".join(part.rstrip(b"\n") for part in parts) + b"\n")
    atexit.register(_remove, path)
    return path


def _certificates(path: Path, variable: str) -> list[bytes]:
    """The PEM texts at ``path`` (a file, or a directory's PEM files); each must hold one."""
    try:
        files = ([path] if not path.is_dir() else
                 sorted(p for p in path.iterdir() if p.suffix.lower() in PEM_SUFFIXES))
        texts = [(p, p.read_bytes()) for p in files]
    except OSError as exc:
        raise ConfigError(f"{variable}={str(path)!r} cannot be read: {exc.strerror}") from None
    if not texts:
        raise ConfigError(f"{variable}={str(path)!r}: no {'/'.join(PEM_SUFFIXES)} file in "
                          "the directory")
    for file, text in texts:
        if _BEGIN not in text:
            raise ConfigError(f"{variable}: {str(file)!r} holds no PEM certificate "
                              f"({_BEGIN.decode()} ...)")
    return [text for _file, text in texts]


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
