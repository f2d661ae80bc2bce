"""The ops wing's commands, as :mod:`celery_beetle.cli` assembles them on ``beetle``: thin
click commands over :mod:`celery_beetle.ops`, heavy imports inside each command.

- ``beetle dead-letters`` (alias ``beetle dead``): :mod:`.cli_dead_letters`;
- ``beetle queues`` and ``beetle fleet``: :mod:`.cli_queues`;
- the options they share: :mod:`.cli_options`.

Exit status: 0 when done; 1 when a broker could not be read or a replay failed; 2 for usage
errors, for ``beetle queues plan`` when a broker differs from the configuration (drift), and
for ``beetle fleet`` when it flags a consumer.
"""

from __future__ import annotations

from celery_beetle.ops.cli_dead_letters import dead_letters
from celery_beetle.ops.cli_queues import fleet, queues

__all__ = ["dead_letters", "fleet", "queues"]
