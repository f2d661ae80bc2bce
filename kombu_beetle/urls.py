"""The two URL chores both packages share: masking secrets and reading ``host:port``.

They live here once, so that a password masked in a ``beetle://`` URL is masked
the same way in a ``redis+sentinel://`` one, and an IPv6 broker parses like an
IPv6 Redis host.  The transport owns this module; ``celery_beetle`` imports it
(never the other way round).  Callers turn the ``ValueError`` of
:func:`parse_host_port` into their own error, which names the whole URL.
"""

from __future__ import annotations

from urllib.parse import unquote

__all__ = ["mask_url", "parse_host_port"]

#: what :func:`mask_url` writes in place of a secret
DEFAULT_MASK = "***"


def mask_url(url: str, mask: str = DEFAULT_MASK) -> str:
    """``url`` with every password replaced by ``mask``, for logs, reprs and errors.

    Masks the password of the userinfo (``user:PASSWORD@h1,h2``, whatever the scheme,
    with ``@`` or ``:`` in the password) and the value of every query parameter whose
    name ends in ``password`` (``password=``, ``sentinel_password=``): Redis URLs carry
    secrets in both places.  Everything else is left exactly as written.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    query_at = rest.find("?")
    if query_at >= 0:
        head, query = rest[:query_at], rest[query_at + 1 :]
    else:
        head, query = rest, None
    if sep:
        head = _mask_userinfo(head, mask)
    masked = f"{scheme}{sep}{head}"
    if query is not None:
        masked += "?" + _mask_query(query, mask)
    return masked


def _mask_userinfo(head: str, mask: str) -> str:
    """``user:secret@hosts/path`` -> ``user:MASK@hosts/path``.

    The userinfo ends at the last ``@`` before the path: a raw ``@`` may sit in a
    password, never in a host list.
    """
    authority, slash, path = head.partition("/")
    userinfo, at, hosts = authority.rpartition("@")
    if not at or ":" not in userinfo:
        return head
    user = userinfo.split(":", 1)[0]
    return f"{user}:{mask}@{hosts}{slash}{path}"


def _mask_query(query: str, mask: str) -> str:
    fragment_at = query.find("#")
    fragment = query[fragment_at:] if fragment_at >= 0 else ""
    query = query[:fragment_at] if fragment_at >= 0 else query
    pairs = []
    for pair in query.split("&"):
        key, eq, value = pair.partition("=")
        if eq and value and unquote(key).lower().endswith("password"):
            pair = f"{key}={mask}"
        pairs.append(pair)
    return "&".join(pairs) + fragment


def parse_host_port(text: str, default_port: int) -> tuple[str, int]:
    """``host``, ``host:port`` or ``[ipv6]:port`` as ``(host, port)``; ValueError if malformed.

    The error names the offending item; the caller adds which URL it came from.
    An IPv6 address must be bracketed, as in URLs: ``::1:5672`` cannot be split.
    """
    item = text.strip()
    if item.startswith("["):
        host, closed, after = item[1:].partition("]")
        if not closed:
            raise ValueError(f"{item!r} opens '[' without closing it (write [ipv6]:port)")
        if after and not after.startswith(":"):
            raise ValueError(f"{item!r} has {after!r} after ']' (write [ipv6]:port)")
        port = after[1:]
    else:
        if item.count(":") > 1:
            raise ValueError(f"{item!r} looks like an IPv6 address: write it as [ipv6]:port")
        host, _, port = item.partition(":")
    if not host:
        raise ValueError(f"{item!r} has no host")
    if not port:
        return host, default_port
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"port {port!r} of {host!r} is not a number from 1 to 65535")
    return host, int(port)
