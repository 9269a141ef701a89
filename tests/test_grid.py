"""PromptGrid: the wrapped grid's messages and replies, collected without Flower's fixed wait."""

import time

from flwr.serverapp import Grid

from pfedes.grid import PromptGrid


class Reply:
    def __init__(self, message_id):
        self.metadata = type("Metadata", (), {"reply_to_message_id": message_id})()


class SlowGrid(Grid):
    """Replies to message i become available `delays[i]` seconds after the push."""

    def __init__(self, delays):
        self.delays, self.pulls, self.pushed_at = delays, 0, None

    def push_messages(self, messages):
        self.pushed_at = time.monotonic()
        return [str(i) for i, _ in enumerate(messages)]

    def pull_messages(self, message_ids):
        self.pulls += 1
        elapsed = time.monotonic() - self.pushed_at
        return [Reply(i) for i in sorted(message_ids) if self.delays[int(i)] <= elapsed]

    def send_and_receive(self, messages, *, timeout=None):  # Flower's: a 3 s wait per check
        raise AssertionError("PromptGrid must not call the wrapped send_and_receive")

    set_run = create_message = get_node_ids = run = None


def test_every_reply_is_collected_soon_after_it_arrives():
    grid = SlowGrid([0.0, 0.05, 0.2])
    t0 = time.monotonic()
    replies = PromptGrid(grid, max_wait=0.05).send_and_receive(["a", "b", "c"])
    assert sorted(r.metadata.reply_to_message_id for r in replies) == ["0", "1", "2"]
    assert time.monotonic() - t0 < 0.2 + 0.05 + 0.1  # within one max_wait of the last reply
    assert grid.pulls < 30  # waits grow while nothing arrives


def test_timeout_returns_what_arrived():
    replies = PromptGrid(SlowGrid([0.0, 10.0])).send_and_receive(["a", "b"], timeout=0.1)
    assert [r.metadata.reply_to_message_id for r in replies] == ["0"]


def test_the_rest_is_delegated():
    class Inner(SlowGrid):
        def get_node_ids(self):
            return [7, 8]

    assert list(PromptGrid(Inner([])).get_node_ids()) == [7, 8]
