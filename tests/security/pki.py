"""Test certificates, made at test time with the openssl CLI (the `cryptography` package is not a
dependency): a CA, a server certificate for localhost and 127.0.0.1, a client certificate, and a
second CA with a client of its own that the servers must not trust."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _key(cwd: Path, name: str) -> None:
    _openssl(
        "genpkey",
        "-algorithm",
        "EC",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-out",
        f"{name}.key",
        cwd=cwd,
    )


def _ca(cwd: Path, name: str) -> None:
    _key(cwd, name)
    _openssl(
        "req",
        "-x509",
        "-new",
        "-key",
        f"{name}.key",
        "-out",
        f"{name}.pem",
        "-days",
        "2",
        "-subj",
        f"/CN=atgrpo test {name}",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
        cwd=cwd,
    )


def _leaf(cwd: Path, name: str, ca: str, cn: str, extensions: str) -> None:
    _key(cwd, name)
    _openssl(
        "req", "-new", "-key", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={cn}", cwd=cwd
    )
    (cwd / f"{name}.ext").write_text(extensions)
    _openssl(
        "x509",
        "-req",
        "-in",
        f"{name}.csr",
        "-CA",
        f"{ca}.pem",
        "-CAkey",
        f"{ca}.key",
        "-CAcreateserial",
        "-out",
        f"{name}.pem",
        "-days",
        "2",
        "-extfile",
        f"{name}.ext",
        cwd=cwd,
    )


@dataclass(frozen=True)
class PKI:
    dir: Path

    def __getattr__(self, name: str) -> str:  # pki.ca_pem, pki.server_key, ... -> path text
        stem, _, ext = name.rpartition("_")
        path = self.dir / f"{stem}.{ext}"
        if not path.exists():
            raise AttributeError(name)
        return str(path)


def make_pki(where: Path) -> PKI:
    where.mkdir(parents=True, exist_ok=True)
    _ca(where, "ca")
    _leaf(
        where,
        "server",
        "ca",
        "localhost",
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n"
        "keyUsage=critical,digitalSignature\n",
    )
    _leaf(
        where,
        "client",
        "ca",
        "atgrpo-client",
        "extendedKeyUsage=clientAuth\nkeyUsage=critical,digitalSignature\n",
    )
    _ca(where, "rogue")
    _leaf(
        where,
        "intruder",
        "rogue",
        "intruder",
        "extendedKeyUsage=clientAuth\nkeyUsage=critical,digitalSignature\n",
    )
    for key in where.glob("*.key"):
        key.chmod(0o600)
    return PKI(where)
