"""Who may connect to a uni-agent cluster: mutual TLS between the driver, the scheduler and the workers.

A Dask scheduler without credentials runs whatever any client sends it (`client.run`), as the user who started the
workers; on a shared node every local user can reach it. So:

- the LocalCluster a run starts uses temporary credentials held only in the memory of its own processes
  (`local_security`): no other process can present them;
- a cluster started apart (cluster/*.sbatch, cluster/launch_jobqueue.py) uses files written once by
  `uni-agent tls init [DIR]` (`write_credentials`): a CA certificate, and one certificate + key signed by it that the
  scheduler, the workers and the driver each present. Whoever can read key.pem can join the cluster and run code as
  its user, so DIR is private: owned by the user, mode 0700, key.pem 0600, never a symlink (checked on every load);
- a scheduler address given as tcp:// is used with a loud warning (`client_security`): it accepts anyone.

DIR defaults to ~/.config/uni-agent/tls (the `tls_dir` setting, UNI_AGENT_TLS_DIR); on a cluster it must be on a disk
every node reads (home directories usually are).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import getpass
import json
import os
import socket
import stat
import sys
import time
from pathlib import Path
from typing import Any

from ..config import ConfigError

CA_FILE, CERT_FILE, KEY_FILE = "ca.pem", "cert.pem", "key.pem"
DEFAULT_DIR = "~/.config/uni-agent/tls"
DEFAULT_DAYS = 365
RENEW_WITHIN = datetime.timedelta(days=1)  # `init` writes new files when the old ones expire sooner than this
CLUSTER_NAME = "uni-agent-cluster"  # the certificate's DNS name; Dask does not check host names (its own CA)
DOCS = "docs/security.md"


class CredentialsError(ConfigError):
    """The TLS directory is missing, not private, or holds unusable files. The message names the path."""


def credentials_dir(setting: str | None) -> Path:
    """The tls_dir setting, else the default, with ~ expanded."""
    return Path(setting or DEFAULT_DIR).expanduser()


def local_security() -> Any:
    """Credentials for a LocalCluster: made now, only in memory, handed to its processes by Dask."""
    from distributed.security import Security

    return Security.temporary()


def file_security(directory: Path) -> Any:
    """A distributed Security from `directory`'s files (every role presents the same certificate), after checking
    that the directory is private and the certificate still valid."""
    from distributed.security import Security

    check_private(directory)
    expires = _not_after(directory / CERT_FILE)
    if expires <= _now():
        raise CredentialsError(f"{directory / CERT_FILE} expired on {expires:%Y-%m-%d %H:%M} UTC: run "
                               f"`uni-agent tls init --force {directory}`, then restart the cluster")
    ca, cert, key = (str(directory / name) for name in (CA_FILE, CERT_FILE, KEY_FILE))
    return Security(require_encryption=True, tls_ca_file=ca, tls_client_cert=cert, tls_client_key=key,
                    tls_scheduler_cert=cert, tls_scheduler_key=key, tls_worker_cert=cert, tls_worker_key=key)


def check_private(directory: Path) -> None:
    """`directory` and its files are this user's alone, else CredentialsError saying what to fix."""
    try:
        info = directory.lstat()
    except FileNotFoundError:
        raise CredentialsError(f"no TLS credentials at {directory}: run `uni-agent tls init {directory}` (and start "
                               f"the cluster with them: {DOCS}), or set UNI_AGENT_TLS_DIR to where they are") from None
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise CredentialsError(f"{directory}: the TLS directory must be a real directory, not a symlink or a file")
    _check_owned(directory, info, 0o077, "chmod 700")
    for name in (CA_FILE, CERT_FILE, KEY_FILE):
        path = directory / name
        try:
            file_info = path.lstat()
        except FileNotFoundError:
            raise CredentialsError(f"{path} is missing: run `uni-agent tls init --force {directory}`, then restart "
                                   "the cluster") from None
        if not stat.S_ISREG(file_info.st_mode):
            raise CredentialsError(f"{path} must be a regular file, not a symlink")
        _check_owned(path, file_info, 0o077 if name == KEY_FILE else 0o022, "chmod 600")


def _check_owned(path: Path, info: os.stat_result, forbidden: int, fix: str) -> None:
    if info.st_uid != os.geteuid():
        raise CredentialsError(f"{path} belongs to uid {info.st_uid}, not to you (uid {os.geteuid()}): TLS "
                               "credentials must be your own")
    if info.st_mode & forbidden:
        raise CredentialsError(f"{path} is mode {stat.S_IMODE(info.st_mode):o}: others could read or change the "
                               f"cluster's credentials; `{fix} {path}`")


def write_credentials(directory: Path, *, days: int = DEFAULT_DAYS, force: bool = False) -> bool:
    """Write a CA and a certificate + key signed by it into `directory` (made 0700). Files that are there and valid
    for more than a day are kept (False) unless `force`; new ones replace them atomically (True)."""
    directory = directory.expanduser()
    _make_private_dir(directory)
    if not force and _still_valid(directory):
        return False
    ca_pem, cert_pem, key_pem = _generate(days)
    # The key first: a cert.pem never names a key that is not there yet.
    for name, data in ((KEY_FILE, key_pem), (CA_FILE, ca_pem), (CERT_FILE, cert_pem)):
        _write_private(directory / name, data)
    return True


def _make_private_dir(directory: Path) -> None:
    directory.parent.mkdir(parents=True, exist_ok=True)
    parent = directory.parent.stat()
    if parent.st_mode & stat.S_IWOTH and not parent.st_mode & stat.S_ISVTX:
        raise CredentialsError(f"{directory.parent} is writable by everyone (and not sticky): anyone could replace "
                               f"{directory.name}; keep the TLS directory under a directory only you can write")
    try:
        directory.mkdir(mode=0o700)
    except FileExistsError:
        info = directory.lstat()
        if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
            raise CredentialsError(f"{directory} exists and is not a directory (a symlink or a file)") from None
        _check_owned(directory, info, 0, "")
    directory.chmod(0o700)  # also narrows a directory made earlier with a wider mode


def _write_private(path: Path, data: bytes) -> None:
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(partial, path)


def _still_valid(directory: Path) -> bool:
    try:
        check_private(directory)
        return _not_after(directory / CERT_FILE) > _now() + RENEW_WITHIN
    except (CredentialsError, ValueError):
        return False


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def _not_after(path: Path) -> datetime.datetime:
    from cryptography import x509

    try:
        cert = x509.load_pem_x509_certificate(path.read_bytes())
    except ValueError as exc:
        raise CredentialsError(f"{path}: not a PEM certificate ({exc})") from None
    return cert.not_valid_after_utc


def _generate(days: int) -> tuple[bytes, bytes, bytes]:
    """(CA certificate, certificate, key), PEM. The CA's own key signs once and is never written: nothing can mint
    another certificate for this CA, so a new cluster member means running init again."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    owner = f"{getpass.getuser()}@{socket.gethostname()}"
    start = _now() - datetime.timedelta(minutes=10)  # nodes' clocks differ a little
    end = start + datetime.timedelta(days=days)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"uni-agent CA of {owner}")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(start).not_valid_after(end)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(_usage(cert_sign=True), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{CLUSTER_NAME} of {owner}")])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(start).not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_usage(cert_sign=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(CLUSTER_NAME)]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return ca.public_bytes(serialization.Encoding.PEM), cert.public_bytes(serialization.Encoding.PEM), key_pem


def _usage(*, cert_sign: bool) -> Any:
    from cryptography import x509

    return x509.KeyUsage(digital_signature=not cert_sign, content_commitment=False, key_encipherment=False,
                         data_encipherment=False, key_agreement=False, key_cert_sign=cert_sign, crl_sign=cert_sign,
                         encipher_only=False, decipher_only=False)


async def scheduler_file_address(path: str, wait_note_s: float = 5) -> str:
    """The address in a scheduler file, waiting for the file as Dask's Client does (a SLURM scheduler job may still be
    queued); says once that it waits."""
    started, said = time.monotonic(), False
    while True:
        try:
            return json.loads(Path(path).read_text())["address"]
        except FileNotFoundError:
            pass
        except (ValueError, KeyError):  # being written
            pass
        if not said and time.monotonic() - started > wait_note_s:
            print(f"waiting for the scheduler file {path} (is the scheduler job running?)", file=sys.stderr)
            said = True
        await asyncio.sleep(0.1)


def client_security(address: str, tls_dir: str | None) -> Any:
    """The Security a driver connects to `address` with: the files of tls_dir for tls://; for any other protocol
    none, with a warning that the scheduler takes code from anyone who reaches it."""
    if address.startswith("tls://"):
        return file_security(credentials_dir(tls_dir))
    print(f"WARNING: the scheduler {address} is not authenticated: anyone who can reach its port (any user of its "
          "node, at least) can run code as the user of its workers. Start it with TLS: `uni-agent tls init`, then the "
          f"--tls-* flags ({DOCS}).", file=sys.stderr)
    return None


def dask_flags(directory: Path) -> str:
    return (f"--protocol tls --tls-ca-file {directory / CA_FILE} --tls-cert {directory / CERT_FILE} "
            f"--tls-key {directory / KEY_FILE}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="tls_command", required=True)
    init = sub.add_parser("init", help="write a CA and a certificate + key for a cluster started apart")
    init.add_argument("dir", nargs="?", default=None,
                      help=f"where (default: UNI_AGENT_TLS_DIR, else {DEFAULT_DIR}); made private (0700)")
    init.add_argument("--days", type=int, default=DEFAULT_DAYS, help=f"validity (default {DEFAULT_DAYS})")
    init.add_argument("--force", action="store_true", help="write new files even where valid ones are (rotation: "
                                                           "restart the cluster and drivers afterwards)")
    init.add_argument("--quiet", action="store_true", help="print nothing unless files are written")


def cmd_tls(args: argparse.Namespace) -> int:
    directory = credentials_dir(args.dir or os.environ.get("UNI_AGENT_TLS_DIR"))
    if args.days < 1:
        raise ConfigError(f"--days must be >= 1 (got {args.days})")
    wrote = write_credentials(directory, days=args.days, force=args.force)
    if wrote or not args.quiet:
        until = _not_after(directory / CERT_FILE)
        print(f"{'wrote' if wrote else 'kept'} TLS credentials in {directory} (valid until {until:%Y-%m-%d} UTC)")
        print(f"dask scheduler/worker flags: {dask_flags(directory)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m uni_agent.driver.tls", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return cmd_tls(args)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
