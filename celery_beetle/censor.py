"""Keep the project's credentials out of Celery's reports of the configuration.

Celery censors a setting in ``celery report``, ``celery inspect conf`` and
``app.conf.humanize(censored=True)`` (all through :func:`celery.app.utils.filter_hidden_settings`)
when its name matches ``HIDDEN_SETTINGS`` (``PASS``, ``KEY``, ``SECRET``, ...), and masks the
password of ``broker_url`` and ``result_backend`` by name. ``beetle_redis_url`` or
``beetle_outbox_db`` match neither, so their passwords were printed; and a mapping is never
masked by its name, only walked key by key, so the management API URLs in
``beetle_management["urls"]`` were printed too.

Celery offers no hook for a setting of its own, so :func:`hide_secret_settings` does two
things, once: it extends the ``HIDDEN_SETTINGS`` pattern with the secret settings'
names (a caller holding the original function still masks their strings), and wraps
``filter_hidden_settings`` so that the whole value of a secret setting, mapping or string,
becomes Celery's mask (``********``). The secret settings are those
:data:`celery_beetle.settings.APP_SETTINGS` marks so.

:May import: ``celery_beetle.settings``
:Not imported by: ``kombu_beetle``, ``celery_beetle.store``, ``celery_beetle.worker``
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from celery_beetle.settings import APP_SETTINGS

__all__ = ["HIDDEN_BEETLE_SETTINGS", "MASK", "hide_secret_settings", "hide_store_url"]

#: settings whose value may carry a password, censored in Celery's reports
HIDDEN_BEETLE_SETTINGS = tuple(sorted(name for name, secret in APP_SETTINGS.items() if secret))

#: what Celery writes in place of a hidden setting's value
MASK = "*" * 8


def hide_secret_settings() -> None:
    """Make Celery censor :data:`HIDDEN_BEETLE_SETTINGS`; calling it again changes nothing."""
    from celery.app import utils

    _extend_pattern(utils)
    if not getattr(utils.filter_hidden_settings, "beetle_censor", False):
        utils.filter_hidden_settings = _masking_secrets(utils.filter_hidden_settings)


#: the name of the first release, kept for callers
hide_store_url = hide_secret_settings


def _extend_pattern(utils: Any) -> None:
    pattern: re.Pattern[str] = utils.HIDDEN_SETTINGS
    names = [name for name in HIDDEN_BEETLE_SETTINGS if not pattern.search(name)]
    if names:
        extra = "|".join(re.escape(name) for name in names)
        utils.HIDDEN_SETTINGS = re.compile(f"{pattern.pattern}|{extra}", pattern.flags)


def _masking_secrets(
    celery_filter: Callable[[Mapping[str, Any]], dict[str, Any]],
) -> Callable[[Mapping[str, Any]], dict[str, Any]]:
    """Celery's filter, then the whole value of every secret setting masked (Celery
    recurses into a mapping itself, calling the module's function: this one)."""

    def filter_hidden_settings(conf: Mapping[str, Any]) -> dict[str, Any]:
        return {
            key: MASK if isinstance(key, str) and key.lower() in HIDDEN_BEETLE_SETTINGS else value
            for key, value in celery_filter(conf).items()
        }

    filter_hidden_settings.beetle_censor = True  # type: ignore[attr-defined]
    filter_hidden_settings.__doc__ = celery_filter.__doc__
    return filter_hidden_settings
