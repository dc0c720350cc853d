"""What a build step needs to reach the package index the way the builder's own pip does.

A build sandbox has a HOME of its own and sees the host's /etc, not the builder's home. Two things the builder's pip
relies on are carried in explicitly:

- the environment's index settings (PIP_*, UV_*, the proxy and CA-bundle variables);
- the proxies' host names, as this process resolves them, added to the sandbox's /etc/hosts: a name the host
  resolves through a mechanism the sandbox does not share (seen in CI: "ProxyError ... Name or service not known"
  from pip inside the sandbox, while pip outside it installed through the same proxy).

The builder's user pip config (~/.config/pip/pip.conf) is not: the environments' own pips are older and a local
file:// index there can name files outside the directories it lists (a build failed on one).
"""

from __future__ import annotations

import ipaddress
import os
import socket
from pathlib import Path
from urllib.parse import urlsplit

PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy")
_PASSED_NAMES = {*PROXY_VARIABLES, "no_proxy", "ssl_cert_file", "ssl_cert_dir", "requests_ca_bundle", "curl_ca_bundle"}


def passed_through(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The builder's settings for reaching the package index (pip's, uv's, a proxy's, a CA bundle's)."""
    environ = dict(os.environ) if environ is None else environ
    return {k: v for k, v in environ.items() if k.startswith(("PIP_", "UV_")) or k.lower() in _PASSED_NAMES}


def proxy_host_lines(settings: dict[str, str]) -> list[str]:
    """/etc/hosts lines for the proxies' host names, each as this process resolves it (names that fail to resolve
    here, IP literals and localhost are left to the sandbox's own resolver)."""
    lines: list[str] = []
    for key, value in settings.items():
        if key.lower() not in PROXY_VARIABLES or not value:
            continue
        host = urlsplit(value if "://" in value else f"http://{value}").hostname
        if not host or host == "localhost" or _is_ip(host) or any(line.endswith(f" {host}") for line in lines):
            continue
        try:
            address = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][4][0]
        except (OSError, UnicodeError):
            continue
        lines.append(f"{address} {host}")
    return lines


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def index_access_args(scratch: Path) -> tuple[list[str], dict[str, str]]:
    """The bwrap arguments (an /etc/hosts with the proxies' names, when there are proxies) and the environment that
    give a build step the builder's way to the index; `scratch`: where the step's /etc/hosts is made."""
    settings = passed_through()
    args: list[str] = []
    extra_hosts = proxy_host_lines(settings)
    if extra_hosts:
        try:
            hosts = Path("/etc/hosts").read_text()
        except OSError:
            hosts = "127.0.0.1 localhost\n"
        made = scratch / "hosts"
        made.write_text(hosts.rstrip("\n") + "\n# the builder's proxies, as it resolves them (uni-agent)\n"
                        + "\n".join(extra_hosts) + "\n")
        args += ["--ro-bind", str(made), "/etc/hosts"]
    return args, settings
