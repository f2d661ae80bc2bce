"""BeetleTask options: resolution against app defaults, validation, time limits, publishing."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery, Task
from celery.exceptions import ImproperlyConfigured
from kombu import Producer

import celery_beetle
from celery_beetle import BeetleTask
from celery_beetle.settings import BeetleSettings
from celery_beetle.store.outcome import Limits
from celery_beetle.task import is_beetle_task, message_id_for, resolve_settings, time_limits_for
from celery_beetle.worker.bootstep import BeetleGateStep, load_settings

URL = "redis://localhost:6379/0"


def make_app(**conf: Any) -> Celery:
    app = Celery("options", broker="memory://", set_as_current=False)
    app.conf.beetle_redis_url = URL
    app.conf.update(conf)
    return celery_beetle.install(app)


def test_retry_delay_option_sets_the_delay_and_task_delay_stays_a_method(recwarn):
    app = make_app()

    @app.task(base=BeetleTask, retry_delay=3, shared=False)
    def job() -> None: ...

    assert job.beetle_settings.delay_s == 3
    assert callable(job.delay)
    assert not [w for w in recwarn if issubclass(w.category, DeprecationWarning)]


def test_deprecated_delay_option_warns_and_is_kept_as_retry_delay_and_task_delay_still_works():
    app = make_app()

    @app.task(base=BeetleTask, delay=3, shared=False)
    def job() -> None: ...

    with pytest.warns(DeprecationWarning, match="use 'retry_delay'"):
        assert job.retry_delay == 3
    assert callable(job.delay)
    assert job.beetle_settings.delay_s == 3


def test_a_task_given_delay_and_a_different_retry_delay_is_refused_naming_it():
    app = make_app()

    @app.task(base=BeetleTask, name="shop.charge", delay=3, retry_delay=4, shared=False)
    def job() -> None: ...

    with (
        pytest.warns(DeprecationWarning),
        pytest.raises(ValueError, match=r"shop\.charge.*set only 'retry_delay'"),
    ):
        job.retry_delay  # noqa: B018 - the task class is built on first use


def test_task_options_override_the_app_wide_defaults():
    app = make_app(
        beetle_default_attempts=5, beetle_default_exceptions=4, beetle_default_retry_delay=7
    )

    @app.task(base=BeetleTask, attempts=2, exceptions=1, timeout=30, shared=False)
    def job() -> None: ...

    settings = job.beetle_settings
    assert (settings.attempts, settings.exceptions, settings.lease_timeout_s) == (2, 1, 30)
    assert settings.delay_s == 7, "unset options keep the app default"


def test_app_wide_defaults_apply_to_tasks_without_options():
    app = make_app(beetle_default_timeout=42, beetle_default_retry_on=["builtins.ValueError"])

    @app.task(base=BeetleTask, shared=False)
    def job() -> None: ...

    assert job.beetle_settings.lease_timeout_s == 42
    assert job.beetle_settings.is_retryable(ValueError())
    assert not job.beetle_settings.is_retryable(KeyError())


def test_resolve_settings_reads_the_task_attributes_and_none_keeps_the_default():
    class Task:
        name = "tasks.charge"
        timeout = 20
        attempts = 5
        exceptions = 3
        retry_delay = None
        max_delay = None
        retry_on = (OSError,)

        def delay(self, *args: object) -> None:
            """Celery's Task.delay(): a method, never a retry delay."""

    settings = resolve_settings(Task(), BeetleSettings(URL))
    assert settings.limits == Limits(20_000, 5, 3, 10_000, 600_000)
    assert settings.retry_on_classes == (OSError,)


def test_resolve_settings_names_a_task_with_contradictory_options():
    class Task:
        name = "tasks.charge"
        exceptions = 2

    with pytest.raises(ValueError, match=r"tasks\.charge.*exceptions=2"):
        resolve_settings(Task(), BeetleSettings(URL))


def test_contradictory_task_options_fail_at_worker_start_naming_the_task():
    app = make_app()

    @app.task(base=BeetleTask, name="shop.charge", attempts=2, exceptions=5, shared=False)
    def job() -> None: ...

    with pytest.raises(ImproperlyConfigured, match=r"shop\.charge.*exceptions=5"):
        load_settings(app)


def test_missing_redis_url_fails_at_worker_start_saying_what_to_set():
    app = make_app(beetle_redis_url=None)
    with pytest.raises(ImproperlyConfigured, match="beetle_redis_url"):
        load_settings(app)


def test_time_limits_end_a_run_before_its_lease_does():
    hard, soft = time_limits_for(300)
    assert soft < hard < 300
    assert 300 - hard == 10
    hard, soft = time_limits_for(5)
    assert (hard, soft) == (4.5, 4.0)
    assert time_limits_for(300, time_limit=60, soft_time_limit=50) == (60, 50)


def test_worker_start_derives_each_beetle_tasks_time_limits_from_its_lease():
    app = make_app()

    @app.task(base=BeetleTask, timeout=20, shared=False)
    def job() -> None: ...

    load_settings(app)
    assert (job.time_limit, job.soft_time_limit) == (18.0, 16.0)


def test_apply_async_marks_the_message_redundant_and_gives_each_publish_its_own_message_id(
    monkeypatch,
):
    app = make_app()
    sent: list[dict[str, Any]] = []
    monkeypatch.setattr(Task, "apply_async", lambda self, *a, **kw: sent.append(kw))

    @app.task(base=BeetleTask, shared=False)
    def job(x: int) -> None: ...

    job.apply_async((1,), task_id="t-1", headers={"mine": "kept"})
    job.apply_async((1,), task_id="t-1")
    job.apply_async((1,), task_id="t-1", message_id="mine")
    job.apply_async((1,))
    first, second, kept, new = (kw["message_id"] for kw in sent)
    assert first != second and "t-1" not in (first, second)
    assert kept == "mine"
    assert new == sent[3]["task_id"], "a new task's id names its message too"
    assert sent[0]["headers"] == {"mine": "kept", "x-beetle-flags": 1}


def test_redundant_false_publishes_one_copy_still_deduplicated(monkeypatch):
    app = make_app()
    sent: list[dict[str, Any]] = []
    monkeypatch.setattr(Task, "apply_async", lambda self, *a, **kw: sent.append(kw))

    @app.task(base=BeetleTask, shared=False)
    def job() -> None: ...

    @app.task(base=BeetleTask, redundant=False, shared=False)
    def single() -> None: ...

    job.apply_async(task_id="a", redundant=False)
    single.apply_async(task_id="b")
    assert [kw["headers"] for kw in sent] == [{}, {}]
    assert all(kw["message_id"] for kw in sent)


def test_a_beetle_tasks_expires_reaches_its_worker_but_no_broker_may_discard_it(monkeypatch):
    """Celery sends ``expires`` as the AMQP ``expiration`` too: a broker would discard the
    message unseen and nobody store REVOKED. A BeetleTask's message keeps Celery's
    ``expires`` header (its worker revokes it) without the property; a plain task's keeps both."""
    app = make_app()
    published: list[dict[str, Any]] = []
    monkeypatch.setattr(Producer, "publish", lambda self, body, **kw: published.append(kw))

    @app.task(base=BeetleTask, shared=False)
    def job() -> None: ...

    @app.task(shared=False)
    def plain() -> None: ...

    job.apply_async(expires=10)
    plain.apply_async(expires=10)
    beetle, celery = published
    assert "expiration" not in beetle and beetle["headers"]["expires"]
    assert celery["expiration"] == 10 and celery["headers"]["expires"]


def test_a_celery_retry_or_replacement_is_a_new_message_with_a_stable_id():
    assert message_id_for("t-1") == "t-1"
    assert message_id_for("t-1", retries=2) == "t-1:retry-2"
    assert message_id_for("t-1", replaced=1) == "t-1:replace-1"
    assert message_id_for("t-1", retries=1, replaced=2) == "t-1:replace-2:retry-1"


def test_plain_tasks_are_not_beetle_tasks_and_install_adds_one_step():
    app = make_app()
    celery_beetle.install(app)

    @app.task(shared=False)
    def plain() -> None: ...

    assert not is_beetle_task(plain)
    assert list(app.steps["consumer"]).count(BeetleGateStep) == 1


def test_called_directly_a_beetle_task_just_runs_its_body():
    app = make_app()

    @app.task(base=BeetleTask, shared=False)
    def add(x: int, y: int) -> int:
        return x + y

    assert add(2, 3) == 5


LIMITS = Limits(attempts=3, exceptions=2)


def test_install_hands_the_trace_dir_to_a_beetle_transport_only():
    from celery import Celery

    import celery_beetle

    beetle = Celery("t1", broker="beetle://h1,h2//", set_as_current=False)
    beetle.conf.beetle_trace_dir = "/tmp/traces"
    celery_beetle.install(beetle)
    assert beetle.conf.broker_transport_options["trace_dir"] == "/tmp/traces"

    own = Celery("t2", broker="beetle://h1,h2//", set_as_current=False)
    own.conf.beetle_trace_dir = "/tmp/traces"
    own.conf.broker_transport_options = {"trace_dir": "/elsewhere"}
    celery_beetle.install(own)
    assert own.conf.broker_transport_options["trace_dir"] == "/elsewhere"

    plain = Celery("t3", broker="pyamqp://h1//", set_as_current=False)
    plain.conf.beetle_trace_dir = "/tmp/traces"
    celery_beetle.install(plain)
    assert "trace_dir" not in (plain.conf.broker_transport_options or {})


@pytest.mark.parametrize(
    "option",
    [
        {"acks_on_failure_or_timeout": False},
        {"acks_on_failure": False},
        {"acks_on_timeout": True},
        {"reject_on_worker_lost": False},
        {"retry_on_worker_lost": True},
    ],
)
def test_a_beetle_task_refuses_an_ack_option_it_cannot_honour_where_it_is_declared(option):
    app = Celery(set_as_current=False)

    # shared=False: a shared task joins every app finalized later, and would raise there
    @app.task(base=BeetleTask, name="shop.charge", shared=False, **option)
    def charge() -> None: ...

    (name,) = option
    with pytest.raises(ValueError, match=rf"'shop.charge': {name}=.*Remove the option"):
        charge.acks_late  # noqa: B018 (the task class is built on first use)


def test_app_wide_ack_settings_reach_plain_tasks_but_not_beetle_tasks():
    app = Celery(set_as_current=False)
    app.conf.update(
        task_acks_late=False,
        task_acks_on_failure_or_timeout=False,
        task_reject_on_worker_lost=False,
    )

    @app.task(base=BeetleTask, name="shop.charge")
    def charge() -> None: ...

    @app.task(name="shop.mail")
    def mail() -> None: ...

    assert (charge.acks_late, charge.acks_on_failure, charge.acks_on_timeout) == (True, True, False)
    assert charge.reject_on_worker_lost and not charge.retry_on_worker_lost
    # Celery 5.7 splits acks_on_failure_or_timeout into acks_on_failure and acks_on_timeout
    assert (mail.acks_late, mail.acks_on_failure_or_timeout) == (False, False)
    assert getattr(mail, "acks_on_failure", False) is False


def test_acks_late_false_is_accepted_on_a_beetle_task():
    app = Celery(set_as_current=False)

    @app.task(base=BeetleTask, name="shop.charge", acks_late=False)
    def charge() -> None: ...

    assert charge.acks_late is False
