"""One URL masker and one host:port parser for both packages (kombu_beetle.urls)."""

from __future__ import annotations

import pytest

from kombu_beetle.urls import mask_url, parse_host_port


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("beetle://bob:hunter2@h1:1,h2:2/v?x=1", "beetle://bob:***@h1:1,h2:2/v?x=1"),
        ("redis://:s3cret@redis.example:6379/0", "redis://:***@redis.example:6379/0"),
        ("redis://u:p@ss:w@rd@h:6379/0", "redis://u:***@h:6379/0"),
        ("redis://u:p%40ss%3Aw@h:6379/0", "redis://u:***@h:6379/0"),
        ("amqp://u:a:b:c@[::1]:5672//", "amqp://u:***@[::1]:5672//"),
        (
            "redis+sentinel://u:s3cret@h1:26379,[fe80::1]:26379/mymaster/0",
            "redis+sentinel://u:***@h1:26379,[fe80::1]:26379/mymaster/0",
        ),
        (
            "redis+sentinel://h1,h2/m?sentinel_password=s3cret&socket_timeout=2",
            "redis+sentinel://h1,h2/m?sentinel_password=***&socket_timeout=2",
        ),
        ("unix:///tmp/redis.sock?db=1&password=s3cret", "unix:///tmp/redis.sock?db=1&password=***"),
        ("rediss://u:pw@h/0?Redis_Password=x#frag", "rediss://u:***@h/0?Redis_Password=***#frag"),
    ],
)
def test_mask_url_hides_every_password_and_keeps_the_rest_as_written(url, masked):
    assert mask_url(url) == masked


@pytest.mark.parametrize(
    "url",
    ["redis://h:6379/0", "redis://user@h", "beetle://h1,h2//?confirm_timeout=2", "h1:5672"],
)
def test_mask_url_leaves_a_url_without_a_password_alone(url):
    assert mask_url(url) == url


def test_mask_url_writes_the_mask_it_is_given():
    assert mask_url("beetle://bob:pw@h1/v", mask="**") == "beetle://bob:**@h1/v"


def test_an_at_sign_in_the_query_does_not_reveal_the_userinfo_password():
    masked = mask_url("redis+sentinel://u:s3cret@h1/m?sentinel_password=a@b")
    assert "s3cret" not in masked and "a@b" not in masked


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("h1", ("h1", 5672)),
        ("h1:5673", ("h1", 5673)),
        (" h1:5673 ", ("h1", 5673)),
        ("10.0.0.1:1", ("10.0.0.1", 1)),
        ("[::1]", ("::1", 5672)),
        ("[fe80::1%eth0]:5673", ("fe80::1%eth0", 5673)),
        ("h1:", ("h1", 5672)),
    ],
)
def test_parse_host_port_reads_names_ipv4_and_bracketed_ipv6(text, expected):
    assert parse_host_port(text, 5672) == expected


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (":5672", "':5672' has no host"),
        ("[]:5672", "has no host"),
        ("h1:56x2", "port '56x2' of 'h1' is not a number from 1 to 65535"),
        ("h1:0", "is not a number from 1 to 65535"),
        ("h1:65536", "is not a number from 1 to 65535"),
        ("[::1:5672", "without closing it"),
        ("[::1]5672", "after ']'"),
        ("::1:5672", "write it as [ipv6]:port"),
    ],
)
def test_parse_host_port_says_which_part_is_wrong(text, problem):
    with pytest.raises(ValueError, match=problem.replace("[", r"\[").replace("]", r"\]")):
        parse_host_port(text, 5672)


def test_the_worker_side_uses_the_same_masker_and_keeps_exporting_it():
    import celery_beetle
    from celery_beetle import settings

    assert settings.mask_url is mask_url and celery_beetle.mask_url is mask_url
    text = repr(settings.BeetleSettings("redis+sentinel://h1,h2/m?sentinel_password=s3cret"))
    assert "s3cret" not in text


def test_a_bad_store_host_is_reported_through_the_shared_parser():
    from celery_beetle.settings import parse_store_url

    with pytest.raises(ValueError, match=r"bad Redis URL .*write it as \[ipv6\]:port"):
        parse_store_url("redis://::1:6379/0")
