"""LeasedResponse: the messages of an answer that cannot be written are released, and those
of one that was written are not."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from starlette.types import Message

from kmq.proxy.leased import CHUNK_BYTES, LeasedResponse

SCOPE: dict[str, Any] = {"type": "http", "method": "POST", "path": "/", "headers": []}


class Connection:
    """A server connection that goes away after ``gone_after`` body writes (never: None)."""

    def __init__(self, gone_after: int | None = None, raises: bool = False) -> None:
        self.gone_after = gone_after
        self.raises = raises
        self.sent: list[Message] = []

    @property
    def gone(self) -> bool:
        writes = sum(1 for m in self.sent if m["type"] == "http.response.body")
        return self.gone_after is not None and writes >= self.gone_after

    async def receive(self) -> Message:
        if self.gone:
            return {"type": "http.disconnect"}
        await asyncio.Event().wait()  # nothing to read: only a cancelled check gets here
        raise AssertionError("unreachable")

    async def send(self, message: Message) -> None:
        if self.gone:
            if self.raises:
                raise OSError("connection closed")
            return  # what uvicorn does: drop it, say nothing
        self.sent.append(message)


def answer(content: Any, connection: Connection) -> list[str]:
    released: list[str] = []
    response = LeasedResponse(content, lambda: released.append("released"))
    asyncio.run(response(SCOPE, connection.receive, connection.send))
    return released


def test_an_answer_written_in_full_releases_nothing() -> None:
    content = {"messages": ["x" * 100_000, "y"]}
    connection = Connection()
    assert answer(content, connection) == []
    assert connection.sent[0]["type"] == "http.response.start"
    body = b"".join(m.get("body", b"") for m in connection.sent[1:])
    assert json.loads(body) == content
    assert connection.sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}
    assert all(len(m.get("body", b"")) <= CHUNK_BYTES for m in connection.sent[1:])


@pytest.mark.parametrize("raises", [False, True])
@pytest.mark.parametrize("gone_after", [0, 1, 2])
def test_a_client_gone_before_the_end_gets_its_messages_released(
    gone_after: int, raises: bool
) -> None:
    content = {"messages": ["x" * (2 * CHUNK_BYTES)]}  # three pieces
    connection = Connection(gone_after, raises)
    assert answer(content, connection) == ["released"]
    assert not any(m.get("more_body") is False for m in connection.sent)
