"""URL parsing and transport options: no server needed."""

from __future__ import annotations

import pytest
from kombu import Connection

import kombu_beetle
from kombu_beetle.errors import InvalidBrokerURL, InvalidTransportOption
from kombu_beetle.options import BrokerAddress, build_options, parse_url


def test_url_lists_brokers_credentials_and_vhost():
    parsed = parse_url("beetle://alice:s%40cret@h1:5673,h2:5674,h3/prod")
    assert parsed.brokers == (
        BrokerAddress("h1", 5673),
        BrokerAddress("h2", 5674),
        BrokerAddress("h3", 5672),
    )
    assert (parsed.userid, parsed.password, parsed.virtual_host) == ("alice", "s@cret", "prod")


@pytest.mark.parametrize(
    ("url", "vhost"),
    [
        ("beetle://h1//", "/"),
        ("beetle://h1/", "/"),
        ("beetle://h1", "/"),
        ("beetle://h1/%2Fweird", "/weird"),
        ("beetle://h1/app", "app"),
    ],
)
def test_vhost_follows_the_amqp_url_convention(url, vhost):
    assert parse_url(url).virtual_host == vhost


def test_localhost_is_pinned_to_ipv4_like_pyamqp():
    assert parse_url("beetle://localhost:5672").brokers == (BrokerAddress("127.0.0.1", 5672),)


def test_url_without_hosts_means_the_local_broker():
    assert parse_url("beetle://").brokers == (BrokerAddress("127.0.0.1", 5672),)


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("amqp://h1:5672//", "scheme must be 'beetle'"),
        ("h1:5672", "missing the 'beetle://' scheme"),
        ("beetle://guest:guest@h1:56x2,h2:5672//", "broker 1: port '56x2' of 'h1'"),
        ("beetle://guest:guest@h1:5672,,h2:5672//", "broker 2 is empty"),
        ("beetle://guest:guest@h1:5672,h1:5672//", "listed twice"),
        ("beetle://guest:guest@h1:99999//", "is not a number from 1 to 65535"),
        ("beetle://guest:guest@::1:5672//", "write it as [ipv6]:port"),
        ("beetle://guest:guest@:5672//", "has no host"),
        ("beetle://h1:5672;h2:5672//", "separate brokers with ','"),
        ("beetle://h1:5672//?bogus=1", "unknown option(s) bogus"),
    ],
)
def test_malformed_url_says_what_is_wrong_and_shows_the_expected_form(url, problem):
    with pytest.raises(InvalidBrokerURL) as info:
        build_options(url)
    assert problem in str(info.value)
    assert "beetle://USER:PASSWORD@HOST1:PORT1,HOST2:PORT2[,...]/VHOST" in str(info.value)


def test_query_options_are_typed_and_transport_options_win():
    options = build_options(
        "beetle://h1,h2//?publish_strategy=primary&confirm_timeout=2.5&redundant_queues=a,b",
        {"confirm_timeout": 1, "read_timeout": 3},
    )
    assert options.publish_strategy == "primary"
    assert options.confirm_timeout_s == 1.0
    assert options.redundant_queues == frozenset({"a", "b"})
    assert options.amqp_options == {"read_timeout": 3}


@pytest.mark.parametrize(
    ("transport_options", "message"),
    [
        ({"publish_strategy": "random"}, "publish_strategy='random' is not one of"),
        ({"confirm_timeout": "soon"}, "must be a number"),
        ({"confirm_publish": "maybe"}, "must be a boolean"),
        ({"redundancy": 0}, "must be >= 1"),
        ({"frobnicate": 1}, "unknown beetle transport option 'frobnicate'"),
        ({"broker_options": {"h9:5672": {}}}, "not in the URL: h9:5672"),
        ({"reconnect_interval": 5, "reconnect_max_interval": 1}, "reconnect_max_interval"),
    ],
)
def test_bad_transport_option_gets_a_clear_error(transport_options, message):
    with pytest.raises(InvalidTransportOption, match=message):
        build_options("beetle://h1,h2//", transport_options)


@pytest.mark.parametrize(
    ("url", "transport_options"),
    [("beetle://h1,h2//?redundancy=5", None), ("beetle://h1//", {"redundancy": 2})],
)
def test_a_redundancy_above_the_number_of_brokers_is_refused_naming_both(url, transport_options):
    with pytest.raises(InvalidTransportOption, match=r"redundancy=\d asks for") as info:
        build_options(url, transport_options)
    assert "set redundancy to at most" in str(info.value)
    assert "h1:5672" in str(info.value)


def test_the_default_redundancy_on_a_one_broker_url_is_kept_without_a_word():
    assert build_options("beetle://h1//").redundancy == 2
    assert build_options("beetle://h1,h2,h3//?redundancy=3").redundancy == 3


def test_retry_policy_options_of_celery_users_are_accepted():
    build_options("beetle://h1//", {"max_retries": 3, "interval_start": 0, "visibility_timeout": 1})


def test_the_retry_options_kombu_connection_reads_from_transport_options_are_accepted():
    build_options(
        "beetle://h1//",
        {"connect_retries_timeout": None, "errback": print, "callback": print, "max_retries": 0},
    )


def test_subscription_only_brokers_are_consumed_but_not_published_to():
    options = build_options(
        "beetle://h1,h2//", {"additional_subscription_brokers": "old1:5672,h2:5672"}
    )
    assert [b.name for b in options.all_brokers] == ["h1:5672", "h2:5672", "old1:5672"]


def test_password_is_masked_in_repr_and_uri():
    options = build_options("beetle://bob:hunter2@h1,h2/v")
    assert "hunter2" not in repr(options)
    conn = Connection("beetle://bob:hunter2@h1:5672,h2:5672/v")
    assert conn.as_uri() == "beetle://bob:**@h1:5672,h2:5672/v"
    assert "hunter2" in conn.as_uri(include_password=True)


def test_a_bad_url_error_does_not_show_the_password():
    with pytest.raises(InvalidBrokerURL) as info:
        build_options("beetle://bob:hunter2@h1:56x2/v")
    assert "hunter2" not in str(info.value) and "hunter2" not in info.value.url
    assert "beetle://bob:***@h1:56x2/v" in str(info.value)


def test_ipv6_brokers_are_written_in_brackets():
    assert parse_url("beetle://[::1]:5673,[fe80::2]/v").brokers == (
        BrokerAddress("::1", 5673),
        BrokerAddress("fe80::2", 5672),
    )


def test_importing_the_package_registers_the_beetle_alias():
    assert Connection("beetle://h1//").transport_cls == "beetle"
    assert isinstance(Connection("beetle://h1//").transport, kombu_beetle.Transport)


def test_a_malformed_url_fails_when_the_transport_is_made():
    with pytest.raises(InvalidBrokerURL):
        Connection("beetle://h1:x//").transport  # noqa: B018


def test_max_message_bytes_defaults_to_rabbitmq_4s_max_message_size():
    assert build_options("beetle://h1//").max_message_bytes == 16 * 1024 * 1024


def test_max_message_bytes_comes_from_the_url_or_the_transport_options_which_win():
    assert build_options("beetle://h1//?max_message_bytes=1024").max_message_bytes == 1024
    options = build_options("beetle://h1//?max_message_bytes=1024", {"max_message_bytes": 2048})
    assert options.max_message_bytes == 2048


@pytest.mark.parametrize("value", [0, "0", -1, "-5", "1.5", 2.5, "16MB", "", None, True])
def test_max_message_bytes_must_be_a_positive_whole_number(value):
    with pytest.raises(InvalidTransportOption, match=r"max_message_bytes=.* whole number of bytes"):
        build_options("beetle://h1//", {"max_message_bytes": value})
