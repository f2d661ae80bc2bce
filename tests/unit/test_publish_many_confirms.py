"""Matching confirms to the copies of :meth:`Publisher.publish_many` by delivery tag."""

from __future__ import annotations

from types import SimpleNamespace

import amqp
from amqp import spec

from kombu_beetle.publish import Copies, _Confirms


def _copies(n: int) -> list[Copies]:
    return [
        Copies(amqp.Message(b"x", message_id=f"m{i}"), [], wanted=2, redundant=True)
        for i in range(n)
    ]


def test_a_multiple_ack_settles_every_copy_up_to_its_tag():
    link = SimpleNamespace(name="rabbit-a")
    copies = _copies(4)
    tags = {tag: (link, c) for tag, c in enumerate(copies, start=1)}
    confirms = _Confirms(link, tags)
    confirms.on_confirm(spec.Basic.Ack, 3, True)
    assert [len(c.done) for c in copies] == [1, 1, 1, 0]
    assert list(tags) == [4]


def test_a_nack_fails_only_its_own_copy_and_an_ack_out_of_order_is_kept():
    link = SimpleNamespace(name="rabbit-a")
    copies = _copies(3)
    tags = {tag: (link, c) for tag, c in enumerate(copies, start=1)}
    confirms = _Confirms(link, tags)
    confirms.on_confirm(spec.Basic.Ack, 3, False)
    confirms.on_confirm(spec.Basic.Nack, 1, False, False)
    assert [len(c.done) for c in copies] == [0, 0, 1]
    assert copies[0].nacked and copies[0].failed == ["rabbit-a"]
    assert list(tags) == [2]
