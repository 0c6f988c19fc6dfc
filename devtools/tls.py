"""A private certificate authority and leaf certificates, made with the ``openssl`` CLI.

    pki = make_pki(tmp_path)       # or: with private_pki() as pki:
    pki.ca_cert                    # the CA to trust (FETCH_CA_BUNDLE)
    pki.leaf                       # (cert, key) for "localhost", SAN DNS:localhost + IP:127.0.0.1
    pki.expired                    # (cert, key), same names, validity ended yesterday
    pki.wrong_host                 # (cert, key) for "wrong.example" only
    pki.other_ca_cert              # a second CA nobody trusts (replace-mode tests)

Leaves are signed by the CA (EC P-256 keys: fast to make). The expired leaf is signed with
``openssl ca -startdate/-enddate`` (a validity that ended yesterday), so no clock is faked.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

LEAF_HOST = "localhost"
WRONG_HOST = "wrong.example"


@dataclass(frozen=True)
class Pki:
    """Paths of the files :func:`make_pki` wrote."""

    root: Path
    ca_cert: Path
    ca_key: Path
    other_ca_cert: Path
    leaf: tuple[Path, Path]
    expired: tuple[Path, Path]
    wrong_host: tuple[Path, Path]


def openssl() -> str:
    found = shutil.which("openssl")
    if found is None:
        raise RuntimeError("openssl not found: apt-get install -y openssl")
    return found


def _run(*args: str, cwd: Path) -> None:
    done = subprocess.run([openssl(), *args], cwd=cwd, capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        raise RuntimeError(f"openssl {args[0]} failed: {done.stderr.strip()}")


def _key(path: Path) -> None:
    _run("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
         "-out", str(path), cwd=path.parent)


def _ca(root: Path, name: str) -> tuple[Path, Path]:
    key, cert = root / f"{name}.key", root / f"{name}.pem"
    _key(key)
    _run("req", "-x509", "-new", "-key", str(key), "-out", str(cert), "-days", "30",
         "-subj", f"/CN=scrape-fleet test {name}",
         "-addext", "basicConstraints=critical,CA:TRUE",
         "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=root)
    return cert, key


def _leaf(root: Path, name: str, ca: tuple[Path, Path], dns: str, ip: str | None,
          expired: bool = False) -> tuple[Path, Path]:
    key, csr, cert = root / f"{name}.key", root / f"{name}.csr", root / f"{name}.pem"
    _key(key)
    _run("req", "-new", "-key", str(key), "-out", str(csr), "-subj", f"/CN={dns}", cwd=root)
    ext = root / f"{name}.ext"
    alt = f"DNS:{dns}" + (f",IP:{ip}" if ip else "")
    ext.write_text("basicConstraints=critical,CA:FALSE\n"
                   "keyUsage=critical,digitalSignature,keyEncipherment\n"
                   "extendedKeyUsage=serverAuth\n"
                   f"subjectAltName={alt}\n")
    ca_cert, ca_key = ca
    if not expired:
        _run("x509", "-req", "-in", str(csr), "-CA", str(ca_cert), "-CAkey", str(ca_key),
             "-CAcreateserial", "-out", str(cert), "-days", "30", "-extfile", str(ext),
             cwd=root)
    else:
        _expired_leaf(root, csr, cert, ca_cert, ca_key, ext)
    return cert, key


def _expired_leaf(root: Path, csr: Path, cert: Path, ca_cert: Path, ca_key: Path,
                  ext: Path) -> None:
    """Sign ``csr`` with a validity that ended yesterday, via ``openssl ca`` (any 3.x)."""
    db = root / "ca-db"
    db.mkdir(exist_ok=True)
    (db / "index.txt").write_text("")
    (db / "serial").write_text("1000\n")
    conf = root / "ca.cnf"
    conf.write_text(
        "[ ca ]\ndefault_ca = test\n"
        "[ test ]\n"
        f"database = {db / 'index.txt'}\nserial = {db / 'serial'}\n"
        f"new_certs_dir = {db}\ndefault_md = sha256\npolicy = any\n"
        "copy_extensions = none\nunique_subject = no\n"
        "[ any ]\ncommonName = supplied\n")
    now = dt.datetime.now(dt.UTC)
    stamp = "%Y%m%d%H%M%SZ"
    _run("ca", "-batch", "-config", str(conf), "-in", str(csr), "-out", str(cert),
         "-cert", str(ca_cert), "-keyfile", str(ca_key), "-extfile", str(ext), "-notext",
         "-startdate", (now - dt.timedelta(days=10)).strftime(stamp),
         "-enddate", (now - dt.timedelta(days=1)).strftime(stamp), cwd=root)


def make_pki(root: Path | str) -> Pki:
    """Write a CA, a second untrusted CA, and the leaves under ``root`` (created if missing)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    ca = _ca(root, "ca")
    other_ca, _other_key = _ca(root, "other-ca")
    leaf = _leaf(root, "leaf", ca, LEAF_HOST, "127.0.0.1")
    expired = _leaf(root, "expired", ca, LEAF_HOST, "127.0.0.1", expired=True)
    wrong = _leaf(root, "wrong-host", ca, WRONG_HOST, None)
    return Pki(root, ca[0], ca[1], other_ca, leaf, expired, wrong)


@contextlib.contextmanager
def private_pki() -> Iterator[Pki]:
    """:func:`make_pki` in a temporary directory removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="test-pki-") as root:
        yield make_pki(root)
