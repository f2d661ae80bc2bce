"""The ``beetle`` group as the CLI reference documents it: each command once.

``celery_beetle.cli.main`` registers some commands under a second name (``beetle dead`` is
``beetle dead-letters``); sphinx-click would document such a command twice, with clashing
targets. :data:`cli` is a copy of the group holding each command under its first name, with
the other names said in the group's help. A command added to ``main`` appears by itself.
"""

from __future__ import annotations

import copy

import click

from celery_beetle.cli import main


def without_aliases(group: click.Group, prog: str) -> click.Group:
    """A copy of ``group`` (run as ``prog``) with each command under its first name only."""
    seen: dict[int, str] = {}
    commands: dict[str, click.Command] = {}
    aliases: list[str] = []
    for name, command in group.commands.items():
        if id(command) in seen:
            aliases.append(f"``{prog} {name}`` is ``{prog} {seen[id(command)]}``")
            continue
        seen[id(command)] = name
        commands[name] = command
    documented = copy.copy(group)
    documented.commands = commands
    if aliases:
        documented.help = f"{group.help}\n\nOther names: {'; '.join(aliases)}."
    return documented


cli = without_aliases(main, "beetle")
