"""Keep the dedup store's URL out of Celery's reports of the configuration.

Celery censors a setting in ``celery report``, ``celery inspect conf`` and
``app.conf.humanize(censored=True)`` when its name matches ``HIDDEN_SETTINGS``
(``PASS``, ``KEY``, ``SECRET``, ...) in :mod:`celery.app.utils`, and masks the
password of ``broker_url`` and ``result_backend`` by name.  ``beetle_redis_url``
matches neither, so its password was printed.  Celery offers no hook for a
setting of its own, and reads the pattern at every call, so :func:`hide_store_url`
extends that pattern with the names of :data:`HIDDEN_BEETLE_SETTINGS`: their
values are replaced by Celery's mask (``********``), like every hidden setting.
"""

from __future__ import annotations

import re

__all__ = ["HIDDEN_BEETLE_SETTINGS", "hide_store_url"]

#: settings whose value may carry a password, censored in Celery's reports
HIDDEN_BEETLE_SETTINGS = ("beetle_redis_url",)


def hide_store_url() -> None:
    """Make Celery censor :data:`HIDDEN_BEETLE_SETTINGS`; calling it again changes nothing."""
    from celery.app import utils

    pattern: re.Pattern[str] = utils.HIDDEN_SETTINGS
    names = [name for name in HIDDEN_BEETLE_SETTINGS if not pattern.search(name)]
    if not names:
        return
    extra = "|".join(re.escape(name) for name in names)
    utils.HIDDEN_SETTINGS = re.compile(f"{pattern.pattern}|{extra}", pattern.flags)
