"""The ``beetle`` command line (``beetle = celery_beetle.cli:main``).

:func:`main` is the click group (:mod:`celery_beetle.cli.group`); ``python -m
celery_beetle.cli`` runs it too.
"""

from __future__ import annotations

from celery_beetle.cli.group import main

__all__ = ["main"]
