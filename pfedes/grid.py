"""Prompt reply collection on any Flower `Grid`.

Flower's grids wait a fixed interval between two checks for replies: 0.1 s in simulation, 3 s
against a SuperLink. A round has two phases (train, evaluate), so on average a round idles for
about one interval after its last reply. `PromptGrid` wraps the grid Flower hands the ServerApp and
changes only that wait: it checks again after `first_wait`, growing by half per empty check up to
`max_wait`, so a reply is noticed within a fraction of a second while a long round costs a few
cheap pulls per second. Everything else goes to the wrapped grid unchanged.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from flwr.app import Message
from flwr.serverapp import Grid

from . import tracing


class PromptGrid(Grid):
    def __init__(self, grid: Grid, first_wait: float = 0.005, max_wait: float = 0.5) -> None:
        self.grid = grid
        self.first_wait, self.max_wait = first_wait, max_wait

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        sent = tracing.now()
        pending = set(self.grid.push_messages(messages))
        deadline = None if timeout is None else time.monotonic() + timeout
        replies: list[Message] = []
        wait = self.first_wait
        while pending:
            received = list(self.grid.pull_messages(pending))
            replies.extend(received)
            pending.difference_update(m.metadata.reply_to_message_id for m in received)
            if not pending or (deadline is not None and time.monotonic() >= deadline):
                break
            wait = self.first_wait if received else min(self.max_wait, wait * 1.5)
            time.sleep(wait if deadline is None else max(0.0, min(wait, deadline - time.monotonic())))
        if replies:
            tracing.record("server", sent=sent, received=tracing.now(), replies=len(replies))
        return replies

    # -- everything else is the wrapped grid's ---------------------------------------------
    def set_run(self, run) -> None:
        self.grid.set_run(run)

    @property
    def run(self):
        return self.grid.run

    def create_message(self, *args, **kwargs) -> Message:
        return self.grid.create_message(*args, **kwargs)

    def get_node_ids(self) -> Iterable[int]:
        return self.grid.get_node_ids()

    def get_nodes(self):
        return self.grid.get_nodes()

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        return self.grid.push_messages(messages)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return self.grid.pull_messages(message_ids)
