"""``python -m celery_beetle.cli``: the ``beetle`` command."""

from celery_beetle.cli import main

main()
