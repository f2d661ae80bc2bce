"""The wire format: message ids and x-beetle-* headers."""

from __future__ import annotations

import pytest

from kombu_beetle import envelope


def test_message_id_is_added_only_where_missing():
    props: dict = {}
    new = envelope.ensure_message_id(props, lambda: "generated")
    assert new == props["message_id"] == "generated"
    props = {"message_id": "from-outbox-row-7"}
    assert envelope.ensure_message_id(props, lambda: "other") == "from-outbox-row-7"


def test_publisher_flag_or_queue_option_marks_a_message_redundant():
    assert envelope.is_redundant({"x-beetle-flags": 1}, "q", frozenset())
    assert envelope.is_redundant({}, "orders", frozenset({"orders"}))
    assert not envelope.is_redundant({"x-beetle-flags": 0}, "q", frozenset({"orders"}))
    assert not envelope.is_redundant(None, "q", frozenset())


def test_redundant_stamp_sets_format_flags_expiry_and_publish_time():
    props: dict = {"application_headers": {"task": "t", "x-beetle-flags": 1}}
    headers = envelope.stamp_redundant(props, ttl_s=60, degraded=False, now=lambda: 1000.5)
    assert headers == {
        "task": "t",
        "x-beetle-format": 1,
        "x-beetle-flags": 1,
        "x-beetle-expires-at": 1060,
        "x-beetle-published-at": 1000500,
    }


def test_degraded_publish_is_flagged_and_a_given_expiry_is_kept():
    props: dict = {"application_headers": {"x-beetle-expires-at": 5}}
    headers = envelope.stamp_redundant(props, ttl_s=60, degraded=True, now=lambda: 1.0)
    assert headers["x-beetle-flags"] == envelope.FLAG_REDUNDANT | envelope.FLAG_DEGRADED
    assert headers["x-beetle-expires-at"] == 5


def test_expiry_is_read_from_the_header():
    assert envelope.is_expired({"x-beetle-expires-at": 10}, now_s=10)
    assert not envelope.is_expired({"x-beetle-expires-at": 11}, now_s=10)
    assert not envelope.is_expired({}, now_s=10)
    assert not envelope.is_expired({"x-beetle-expires-at": "bad"}, now_s=10)


@pytest.mark.parametrize("expires_at", ["inf", float("nan"), "abc", 1e17, 1_000 + 367 * 86_400])
def test_a_publisher_given_expiry_that_is_not_unix_seconds_within_a_year_is_refused(expires_at):
    props = {"application_headers": {"x-beetle-expires-at": expires_at}}
    with pytest.raises(envelope.InvalidExpiry, match="x-beetle-expires-at"):
        envelope.stamp_redundant(props, ttl_s=60, degraded=False, now=lambda: 1000.0)


def test_a_publisher_given_expiry_within_a_year_is_kept():
    props = {"application_headers": {"x-beetle-expires-at": 5_000}}
    headers = envelope.stamp_redundant(props, ttl_s=60, degraded=False, now=lambda: 1000.0)
    assert headers["x-beetle-expires-at"] == 5_000
