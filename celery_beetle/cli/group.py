"""The ``beetle`` group: it assembles the commands each wing keeps, and holds none of its own.

========================================  ============================================
``beetle status`` (``--watch``)           :mod:`celery_beetle.cli.status`,
                                          :mod:`celery_beetle.cli.top`
``beetle audit``                          :mod:`celery_beetle.audit.cli`
``beetle dead-letters``,                   :mod:`celery_beetle.ops.cli`
``beetle queues``, ``beetle fleet``
``beetle outbox``, ``beetle relay``       :mod:`celery_beetle.outbox.cli`
========================================  ============================================

Each command is a thin layer over its wing, usable from Python too. Heavy dependencies
(pyspark, matplotlib, celery, SQLAlchemy) are imported inside the command that needs them,
so ``beetle --help`` and quick commands start in a fraction of a second.

``beetle dead`` is a shorter name of ``beetle dead-letters``, kept out of ``--help``. Every
command's errors are one line (:mod:`celery_beetle.cli.errors`).
"""

from __future__ import annotations

import click

from celery_beetle.audit.cli import audit
from celery_beetle.cli.errors import guard_commands
from celery_beetle.cli.status import status
from celery_beetle.ops.cli import dead_letters, fleet, queues
from celery_beetle.outbox.cli import outbox, relay

__all__ = ["main"]


class _Group(click.Group):
    """A group whose aliases answer but stay out of ``--help``."""

    aliases = {"dead": "dead-letters"}

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return super().get_command(ctx, self.aliases.get(cmd_name, cmd_name))


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="kombu-beetle", message="%(version)s")
def main() -> None:
    """kombu-beetle / celery-beetle: Celery over N RabbitMQ brokers, exactly once."""


main.add_command(audit)
main.add_command(dead_letters)
main.add_command(queues)
main.add_command(outbox)
main.add_command(relay)
main.add_command(fleet)
main.add_command(status)
guard_commands(main)
