"""generation.collect when a non-streamed request's client leaves: the streams are closed (which
aborts their engine requests) and ClientDisconnected is raised, never a KeyError on the empty
result that used to be logged as a 500."""

from __future__ import annotations

import asyncio

import pytest

from lantern.server.errors import ClientDisconnected
from lantern.server.generation import collect


class _Request:
    """A test double of starlette's Request: only is_disconnected() is read."""

    def __init__(self, gone: bool):
        self.gone = gone

    async def is_disconnected(self) -> bool:
        return self.gone


def _stream(closed: list[bool], steps: int | None):
    async def gen():
        try:
            i = 0
            while steps is None or i < steps:
                await asyncio.sleep(0.01)
                yield 0, i
                i += 1
        finally:
            closed.append(True)

    return gen()


def test_a_client_that_leaves_closes_the_streams_and_raises():
    closed: list[bool] = []
    with pytest.raises(ClientDisconnected):
        asyncio.run(collect(_stream(closed, None), _Request(gone=True), poll_s=0.02))
    assert closed == [True]


def test_a_client_that_stays_gets_the_last_outputs():
    closed: list[bool] = []
    finals = asyncio.run(collect(_stream(closed, 5), _Request(gone=False), poll_s=0.02))
    assert finals == {0: 4} and closed == [True]
