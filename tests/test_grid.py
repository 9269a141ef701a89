"""PromptGrid: the wrapped grid's messages and replies, collected without Flower's fixed wait.
A fake clock drives both the grid and PromptGrid's sleeps, so nothing here depends on timing."""

import pytest
from flwr.serverapp import Grid

import pfedes.grid
from pfedes.grid import PromptGrid


class FakeClock:
    def __init__(self):
        self.now, self.sleeps = 0.0, []

    def monotonic(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(pfedes.grid, "time", fake)
    return fake


class Reply:
    def __init__(self, message_id):
        self.metadata = type("Metadata", (), {"reply_to_message_id": message_id})()


class SlowGrid(Grid):
    """Replies to message i become available `delays[i]` seconds after the push."""

    def __init__(self, clock, delays):
        self.clock, self.delays, self.pulls, self.pushed_at = clock, delays, 0, None

    def push_messages(self, messages):
        self.pushed_at = self.clock.now
        return [str(i) for i, _ in enumerate(messages)]

    def pull_messages(self, message_ids):
        self.pulls += 1
        elapsed = self.clock.now - self.pushed_at
        return [Reply(i) for i in sorted(message_ids) if self.delays[int(i)] <= elapsed]

    def send_and_receive(self, messages, *, timeout=None):  # Flower's: a fixed wait per check
        raise AssertionError("PromptGrid must not call the wrapped send_and_receive")

    set_run = create_message = get_node_ids = run = None


def test_every_reply_is_collected_within_one_max_wait_of_its_arrival(clock):
    grid = SlowGrid(clock, [0.0, 0.05, 30.0])
    replies = PromptGrid(grid, first_wait=0.005, max_wait=0.5).send_and_receive(["a", "b", "c"])
    assert sorted(r.metadata.reply_to_message_id for r in replies) == ["0", "1", "2"]
    assert clock.now < 30.0 + 0.5
    assert max(clock.sleeps) <= 0.5
    assert grid.pulls < 30.0 / 0.5 + 20  # waits grow while nothing arrives: few pulls in a long round


def test_timeout_returns_what_arrived(clock):
    replies = PromptGrid(SlowGrid(clock, [0.0, 10.0])).send_and_receive(["a", "b"], timeout=2.0)
    assert [r.metadata.reply_to_message_id for r in replies] == ["0"]
    assert clock.now == pytest.approx(2.0)


def test_the_rest_is_delegated(clock):
    class Inner(SlowGrid):
        def get_node_ids(self):
            return [7, 8]

    assert list(PromptGrid(Inner(clock, [])).get_node_ids()) == [7, 8]
