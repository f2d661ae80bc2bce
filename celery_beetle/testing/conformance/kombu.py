"""kombu's own transport suite (``t/integration/test_py_amqp.py``) over ``beetle://``.

The suite builds its URLs as ``pyamqp://{RABBITMQ_HOST}:{RABBITMQ_5672_TCP}``; a copy of the
tree whose suite says ``beetle://`` instead (and imports :mod:`kombu_beetle`, which
registers the scheme) runs the same tests over both brokers when the "port" is
``PORT1,HOST:PORT2`` (:meth:`~.runner.Servers.kombu_environment`). The copy keeps the file's
name, so the two runs name each test alike.
"""

from __future__ import annotations

import shutil
from pathlib import Path

__all__ = ["SUITE", "beetle_copy"]

SUITE = "t/integration/test_py_amqp.py"


def beetle_copy(tree: Path) -> Path:
    """``<tree>-beetle``: ``tree`` with its transport suite over ``beetle://``."""
    copy = tree.with_name(f"{tree.name}-beetle")
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(tree, copy)
    suite = copy / SUITE
    text = suite.read_text().replace("pyamqp://", "beetle://")
    future = "from __future__ import annotations\n"  # must stay the first statement
    registers = "import kombu_beetle  # noqa: F401  (registers beetle://)\n"
    suite.write_text(text.replace(future, future + registers, 1))
    return copy
