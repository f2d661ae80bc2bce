"""BeetleSettings: defaults, app.conf, per-task options, and errors that say what to do."""

from __future__ import annotations

import dataclasses

import pytest
from celery import Celery

from celery_beetle.settings import BeetleSettings, mask_url, parse_store_url
from celery_beetle.store import RedisStore
from celery_beetle.store.outcome import Limits

URL = "redis://localhost:6379/0"


def make_app(**conf: object) -> Celery:
    app = Celery("test_settings", set_as_current=False)
    app.conf.update(conf)
    return app


def test_defaults_follow_beetle_one_attempt_no_exceptions_and_a_five_minute_lease():
    settings = BeetleSettings(URL)
    assert settings.limits == Limits(
        lease_timeout_ms=300_000, attempts=1, exceptions=0, delay_ms=10_000, max_delay_ms=600_000
    )
    assert settings.message_ttl_ms == 86_400_000
    assert settings.key_prefix == "beetle:"
    assert settings.is_retryable(ValueError())
    assert not settings.is_retryable(KeyboardInterrupt())


def test_from_app_reads_the_url_trace_dir_and_app_wide_defaults():
    app = make_app(
        beetle_redis_url=URL,
        beetle_trace_dir="/tmp/trace",
        beetle_default_timeout=30,
        beetle_default_attempts=4,
        beetle_default_exceptions=2,
        beetle_default_retry_delay=1.5,
        beetle_default_max_delay=60,
        beetle_default_retry_on=["builtins.OSError"],
    )
    settings = BeetleSettings.from_app(app)
    assert settings.redis_url == URL
    assert settings.trace_dir == "/tmp/trace"
    assert settings.limits == Limits(30_000, 4, 2, 1_500, 60_000)
    assert settings.retry_on_classes == (OSError,)


def test_from_app_without_a_redis_url_says_which_setting_to_set():
    with pytest.raises(ValueError, match="beetle_redis_url"):
        BeetleSettings.from_app(make_app())


def test_a_bad_redis_url_shows_the_expected_forms():
    with pytest.raises(ValueError, match=r"redis\+sentinel://"):
        BeetleSettings("http://localhost")


@pytest.mark.parametrize(
    ("changes", "hint"),
    [
        ({"lease_timeout_s": 0}, "lease_timeout_s must be a positive"),
        ({"lease_timeout_s": -5}, "lease_timeout_s must be a positive"),
        ({"attempts": 0}, "attempts must be an integer of at least 1"),
        ({"exceptions": -1}, "exceptions must be an integer of at least 0"),
        ({"delay_s": -1}, "delay_s must be 0 or more"),
        ({"delay_s": 10, "max_delay_s": 5}, "raise max_delay_s or lower delay_s"),
        ({"message_ttl_s": 0}, "message_ttl_s must be a positive"),
        ({"key_prefix": "a{b"}, "must not contain braces"),
        ({"lease_timeout_s": "300"}, "must be a number of seconds"),
        ({"redis_wait_replicas": -1}, "redis_wait_replicas must be an integer of at least 0"),
        ({"redis_wait_replicas": True}, "redis_wait_replicas must be an integer of at least 0"),
    ],
)
def test_invalid_settings_are_refused_with_a_clear_message(changes, hint):
    with pytest.raises(ValueError, match=hint):
        BeetleSettings(URL, **changes)


def test_more_exceptions_than_attempts_allow_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="set attempts to at least 4 or exceptions to at most 2"):
        BeetleSettings(URL, attempts=3, exceptions=3)


def test_exceptions_up_to_attempts_minus_one_are_accepted():
    assert BeetleSettings(URL, attempts=3, exceptions=2).exceptions == 2


def test_retry_on_takes_classes_dotted_names_and_a_single_class():
    settings = BeetleSettings(URL, retry_on=("ConnectionError", "socket.timeout", KeyError))
    assert settings.retry_on_classes == (ConnectionError, TimeoutError, KeyError)
    assert BeetleSettings(URL, retry_on=OSError).retry_on_classes == (OSError,)  # type: ignore[arg-type]


def test_retry_on_with_a_name_that_cannot_be_imported_fails_at_start():
    with pytest.raises(ValueError, match="cannot be imported"):
        BeetleSettings(URL, retry_on=("nowhere.NoSuchError",))


def test_retry_on_refuses_what_is_not_an_exception_class():
    with pytest.raises(ValueError, match="exception classes"):
        BeetleSettings(URL, retry_on=("builtins.len",))


def test_repr_masks_the_password():
    text = repr(BeetleSettings("redis://:s3cret@redis.example:6379/0"))
    assert "s3cret" not in text
    assert "redis://:***@redis.example:6379/0" in text


def test_repr_masks_a_sentinel_password_with_several_hosts():
    text = repr(BeetleSettings("redis+sentinel://u:s3cret@h1:26379,h2:26379/mymaster"))
    assert "s3cret" not in text and "u:***@h1:26379,h2:26379/mymaster" in text


def test_settings_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        BeetleSettings(URL).attempts = 3  # type: ignore[misc]


def test_with_options_refuses_an_unknown_option():
    with pytest.raises(TypeError, match="unknown beetle task option"):
        BeetleSettings(URL).with_options(timeout_s=3)


def test_with_options_takes_the_task_option_names():
    settings = BeetleSettings(URL).with_options(
        retry_delay=2, max_delay=8, attempts=2, exceptions=1
    )
    assert settings.limits == Limits(300_000, 2, 1, 2_000, 8_000)


def test_with_options_takes_the_deprecated_delay_for_retry_delay_with_a_warning():
    with pytest.warns(DeprecationWarning, match="use 'retry_delay'"):
        settings = BeetleSettings(URL).with_options(delay=2, max_delay=8)
    assert settings.delay_s == 2


def test_with_options_refuses_delay_and_retry_delay_that_disagree():
    with (
        pytest.warns(DeprecationWarning),
        pytest.raises(ValueError, match="set only 'retry_delay'"),
    ):
        BeetleSettings(URL).with_options(delay=2, retry_delay=3)


def test_the_deprecated_app_setting_beetle_default_delay_still_works_with_a_warning():
    app = make_app(beetle_redis_url=URL, beetle_default_delay=4)
    with pytest.warns(DeprecationWarning, match="use 'beetle_default_retry_delay'"):
        settings = BeetleSettings.from_app(app)
    assert settings.delay_s == 4


def test_the_old_and_new_app_delay_settings_may_agree_but_not_disagree():
    agreeing = make_app(beetle_redis_url=URL, beetle_default_delay=4, beetle_default_retry_delay=4)
    with pytest.warns(DeprecationWarning):
        assert BeetleSettings.from_app(agreeing).delay_s == 4
    disagreeing = make_app(
        beetle_redis_url=URL, beetle_default_delay=4, beetle_default_retry_delay=5
    )
    with (
        pytest.warns(DeprecationWarning),
        pytest.raises(ValueError, match="set only 'beetle_default_retry_delay'"),
    ):
        BeetleSettings.from_app(disagreeing)


def test_the_new_app_setting_beetle_default_retry_delay_does_not_warn(recwarn):
    settings = BeetleSettings.from_app(make_app(beetle_redis_url=URL, beetle_default_retry_delay=3))
    assert settings.delay_s == 3
    assert not [w for w in recwarn if issubclass(w.category, DeprecationWarning)]


# The store URL (celery_beetle.store.redis.parse_store_url), checked when settings are built


def test_a_plain_url_names_one_redis_with_its_database():
    address = parse_store_url("rediss://user:pw@cache.example:6380/3")
    assert (address.kind, address.tls, address.hosts, address.db) == (
        "redis",
        True,
        (("cache.example", 6380),),
        3,
    )
    assert (address.username, address.password) == ("user", "pw")


def test_a_url_without_port_or_database_uses_6379_and_database_0():
    address = parse_store_url("redis://cache.example")
    assert (address.hosts, address.db, address.password) == ((("cache.example", 6379),), 0, None)


def test_a_sentinel_url_names_the_sentinels_the_service_and_the_database():
    address = parse_store_url("redis+sentinel://:pw@s1:26379,s2,[::1]:26380/mymaster/2")
    assert address.kind == "sentinel"
    assert address.hosts == (("s1", 26379), ("s2", 26379), ("::1", 26380))
    assert (address.service_name, address.db, address.password) == ("mymaster", 2, "pw")


def test_a_cluster_url_names_its_startup_nodes():
    address = parse_store_url("redis+cluster://n1:7000,n2:7001?socket_timeout=2")
    assert (address.kind, address.hosts) == ("cluster", (("n1", 7000), ("n2", 7001)))
    assert address.options == {"socket_timeout": "2"}


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("", "it is empty"),
        ("localhost:6379", "no scheme"),
        ("memcached://h", "unknown scheme 'memcached'"),
        ("redis://", "no host"),
        ("redis://h:port/0", "port 'port' of 'h' is not a number"),
        ("redis://h1,h2/0", "several hosts need redis\\+sentinel"),
        ("redis://h/zero", "not a database number"),
        ("redis+sentinel://s1:26379", "needs /service_name"),
        ("redis+sentinel://s1/m/x", "needs /service_name"),
        ("redis+cluster://n1:7000/0", "no database or service name"),
        ("redis+cluster://n1:7000?db=1", "unknown option"),
    ],
)
def test_a_bad_store_url_says_what_is_wrong_and_shows_every_expected_form(url, why):
    with pytest.raises(ValueError, match=why) as error:
        parse_store_url(url)
    for form in ("redis://", "rediss://", "redis+sentinel://", "redis+cluster://"):
        assert form in str(error.value)


def test_a_bad_url_error_does_not_show_the_password():
    with pytest.raises(ValueError) as error:
        parse_store_url("redis://:s3cret@h:port")
    assert "s3cret" not in str(error.value)


def test_mask_url_leaves_a_url_without_password_alone():
    assert mask_url("redis://h:6379/0") == "redis://h:6379/0"
    assert mask_url("redis://user@h") == "redis://user@h"


def test_a_sentinel_store_is_built_without_connecting():
    store = RedisStore.from_url("redis+sentinel://127.0.0.1:1/mymaster/1")
    assert store.client.connection_pool.service_name == "mymaster"
    assert "mymaster" in repr(store)


def test_wait_replicas_comes_from_app_conf_and_reaches_the_store():
    app = make_app(beetle_redis_url=URL, beetle_redis_wait_replicas=1)
    settings = BeetleSettings.from_app(app)
    assert settings.redis_wait_replicas == 1
    assert RedisStore.from_settings(settings).wait_replicas == 1
    assert BeetleSettings(URL).redis_wait_replicas == 0  # off unless asked for


def test_wait_replicas_on_a_cluster_url_is_refused_at_start():
    with pytest.raises(ValueError, match="not supported on Redis Cluster"):
        BeetleSettings("redis+cluster://h1:7000,h2:7001", redis_wait_replicas=1)
