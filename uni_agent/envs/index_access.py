"""What a build step needs to reach the package index the way the builder's own pip does.

A build sandbox has a HOME of its own, and sees the host's /etc but nothing of /opt, /srv or the builder's home. So
three things the builder's pip may rely on are carried in explicitly:

- the environment's index settings (PIP_*, UV_*, the proxy and CA-bundle variables);
- the builder's user pip config (~/.config/pip/pip.conf, ~/.pip/pip.conf), copied into the step's HOME, and the
  local directories that it or the environment names for find-links or a file:// index, bound read-only;
- the proxies' host names, as this process resolves them, added to the sandbox's /etc/hosts: a name the host
  resolves through a mechanism the sandbox does not share (seen in CI: "ProxyError ... Name or service not known"
  from pip inside the sandbox, while pip outside it installed through the same proxy).
"""

from __future__ import annotations

import configparser
import ipaddress
import os
import socket
from pathlib import Path
from urllib.parse import unquote, urlsplit

PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy")
_PASSED_NAMES = {*PROXY_VARIABLES, "no_proxy", "ssl_cert_file", "ssl_cert_dir", "requests_ca_bundle", "curl_ca_bundle"}
# pip options whose values may name local directories (space-separated lists of paths or URLs)
_LOCATION_OPTIONS = ("find-links", "index-url", "extra-index-url")
USER_PIP_CONFIGS = (".config/pip/pip.conf", ".pip/pip.conf")


def passed_through(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The builder's settings for reaching the package index (pip's, uv's, a proxy's, a CA bundle's)."""
    environ = dict(os.environ) if environ is None else environ
    return {k: v for k, v in environ.items() if k.startswith(("PIP_", "UV_")) or k.lower() in _PASSED_NAMES}


def user_pip_configs(home: Path | None = None) -> list[tuple[str, str]]:
    """(path relative to HOME, text) of the builder's user pip config files that exist."""
    home = Path.home() if home is None else home
    found = []
    for relative in USER_PIP_CONFIGS:
        path = home / relative
        if path.is_file():
            try:
                found.append((relative, path.read_text()))
            except OSError:
                continue  # unreadable: pip outside the sandbox could not read it either
    return found


def local_locations(settings: dict[str, str], configs: list[tuple[str, str]]) -> list[str]:
    """Existing local directories named for find-links or an index, by the environment or the user's pip config."""
    values = [v for k, v in settings.items()
              if k.upper() in ("PIP_FIND_LINKS", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL")]
    for _, text in configs:
        parser = configparser.ConfigParser(interpolation=None)
        try:
            parser.read_string(text)
        except configparser.Error:
            continue
        values += [parser[section][option] for section in parser.sections() for option in _LOCATION_OPTIONS
                   if option in parser[section]]
    found: list[str] = []
    for value in values:
        for item in value.split():
            path = unquote(urlsplit(item).path) if item.startswith("file:") else item
            if path.startswith("/") and os.path.isdir(path) and path not in found:
                found.append(path)
    return found


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


def index_access_args(scratch: Path, home: Path) -> tuple[list[str], dict[str, str]]:
    """The bwrap arguments (binds) and environment that give a build step the builder's way to the index. `home`:
    the step's HOME on the host (the user pip config goes there); `scratch`: where the step's /etc/hosts is made."""
    settings = passed_through()
    configs = user_pip_configs()
    for relative, text in configs:
        target = home / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    args: list[str] = []
    for location in local_locations(settings, configs):
        args += ["--ro-bind", location, location]
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
