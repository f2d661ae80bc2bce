"""TLS to the dedup store: the same ssl_* query options for every URL form, host names
verified by default. Clients are built, not connected: no server needed."""

from __future__ import annotations

from typing import Any

import pytest

from celery_beetle.settings import parse_store_url
from celery_beetle.store import address as store

TLS_QUERY = "ssl_ca_certs=/ca.pem&ssl_certfile=/client.pem&ssl_keyfile=/client.key"
EXPECTED = {
    "ssl_ca_certs": "/ca.pem",
    "ssl_certfile": "/client.pem",
    "ssl_keyfile": "/client.key",
    "ssl_cert_reqs": "required",
    "ssl_check_hostname": True,
}


def _subset(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {k: kwargs.get(k) for k in EXPECTED}


def test_a_rediss_url_passes_the_tls_options_and_verifies_the_host_name():
    client = store.connect(f"rediss://:pw@redis.example:6380/0?{TLS_QUERY}")
    assert _subset(client.connection_pool.connection_kwargs) == EXPECTED


def test_a_rediss_sentinel_url_passes_them_to_the_master_and_to_every_sentinel():
    client = store.connect(f"rediss+sentinel://s1:26379,s2:26379/mymaster/2?{TLS_QUERY}")
    pool = client.connection_pool
    assert _subset(pool.connection_kwargs) == EXPECTED
    for sentinel in pool.sentinel_manager.sentinels:
        kwargs = sentinel.connection_pool.connection_kwargs
        assert _subset(kwargs) == EXPECTED
        assert sentinel.connection_pool.connection_class.__name__ == "SSLConnection"


def test_a_rediss_cluster_url_passes_them_to_the_cluster_client(monkeypatch):
    made: dict[str, Any] = {}
    monkeypatch.setattr(store, "RedisCluster", lambda **kwargs: made.update(kwargs))
    store.connect(f"rediss+cluster://n1:7000,n2:7001?{TLS_QUERY}")
    assert made["ssl"] is True and _subset(made) == EXPECTED


def test_host_name_checking_is_off_only_when_asked_for():
    off = parse_store_url("rediss://h?ssl_check_hostname=false").tls_kwargs()
    assert off["ssl_check_hostname"] is False and off["ssl_cert_reqs"] == "required"
    unverified = parse_store_url("rediss+cluster://h:7000?ssl_cert_reqs=none").tls_kwargs()
    assert unverified == {"ssl_cert_reqs": "none", "ssl_check_hostname": False}
    assert parse_store_url("redis://h").tls_kwargs() == {}


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("redis://h/0?ssl_ca_certs=/ca.pem", "ssl_ca_certs need TLS: write rediss://"),
        ("redis+sentinel://h/m?ssl_certfile=/c.pem", "ssl_certfile need TLS"),
        ("rediss://h?ssl_cert_reqs=maybe", "ssl_cert_reqs must be one of"),
        ("rediss+cluster://h?ssl_check_hostname=perhaps", "ssl_check_hostname must be"),
    ],
)
def test_tls_options_on_a_plain_url_or_with_bad_values_are_refused(url, problem):
    with pytest.raises(ValueError, match=problem):
        parse_store_url(url)
