"""The ``beetle`` group as the CLI reference documents it: each command once, as it is
written today.

``celery_beetle.cli.main`` answers to a few shorter names that ``--help`` does not list
(``beetle dead`` is ``beetle dead-letters``: the group's ``aliases``), and some commands
still take an old spelling (the queue as the first argument) through a hidden argument.
:data:`cli` is a copy of the group whose help names the aliases once and whose commands
leave the hidden arguments out. A command added to ``main`` appears by itself.
"""

from __future__ import annotations

import copy

import click

from celery_beetle.cli import main
from celery_beetle.ops.cli_options import HiddenArgument


def documented(command: click.Command) -> click.Command:
    """A copy of ``command`` (and of every command under it) without hidden arguments."""
    shown = copy.copy(command)
    shown.params = [p for p in command.params if not isinstance(p, HiddenArgument)]
    if isinstance(command, click.Group):
        assert isinstance(shown, click.Group)
        shown.commands = {name: documented(sub) for name, sub in command.commands.items()}
    return shown


def with_aliases_said(group: click.Group, prog: str) -> click.Group:
    """A documented copy of ``group`` (run as ``prog``) whose help names its aliases."""
    shown = documented(group)
    assert isinstance(shown, click.Group)
    aliases = getattr(group, "aliases", {})
    if aliases:
        said = "; ".join(
            f"``{prog} {alias}`` is ``{prog} {name}``" for alias, name in aliases.items()
        )
        shown.help = f"{group.help}\n\nOther names: {said}."
    return shown


cli = with_aliases_said(main, "beetle")
