"""The opt-in timing trace: written only when PFEDES_TRACE is set, and read back step by step."""

import json
import subprocess
import sys

from pfedes import tracing


def test_nothing_is_written_without_the_variable(tmp_path, monkeypatch):
    monkeypatch.delenv(tracing.TRACE_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    tracing.record("server", sent=1.0, received=2.0, replies=1)
    assert list(tmp_path.iterdir()) == []


def test_a_line_per_record_with_the_process_id(tmp_path, monkeypatch):
    path = tmp_path / "trace.jsonl"
    monkeypatch.setenv(tracing.TRACE_ENV, str(path))
    tracing.record("server", sent=1.0, received=2.0, replies=3)
    tracing.record("server", sent=3.0, received=4.0, replies=3)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["sent"] for line in lines] == [1.0, 3.0] and all(line["kind"] == "server" for line in lines)


def test_a_trace_file_that_cannot_be_written_does_not_raise(tmp_path, monkeypatch):
    monkeypatch.setenv(tracing.TRACE_ENV, str(tmp_path / "missing-dir" / "trace.jsonl"))
    tracing.record("server", sent=1.0, received=2.0, replies=1)
    tracing.record("server", sent=1.0, received=2.0, replies=1)
    assert not (tmp_path / "missing-dir").exists()


def test_a_new_process_knows_it_started_a_moment_ago():
    code = "import time; from pfedes import tracing; s = tracing.process_start_time(); print(time.time() - s)"
    age = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert 0 <= age < 30  # interpreter start and imports; a wrong boot-time reading is off by hours


def test_breakdown_splits_each_message_on_hand_computed_times():
    def client(round_, process_start, entered, set_up, done):
        return {"kind": "clientapp", "round": round_, "process_start": process_start, "entered": entered,
                "set_up": set_up, "done": done}

    lines = [{"kind": "server", "sent": 0.0, "received": 10.0, "replies": 1},
             {"kind": "server", "sent": 20.0, "received": 30.0, "replies": 2},
             client(1, 1.0, 5.0, 6.0, 9.0),
             client(2, 21.0, 24.0, 26.0, 27.5),
             client(2, None, 25.0, 26.0, 29.0)]  # no /proc: pick-up counted with start-up
    steps = tracing.breakdown("\n".join(json.dumps(line) for line in lines), first_round=2)
    assert steps == {tracing.STEPS[0]: [1.0], tracing.STEPS[1]: [3.0, 5.0], tracing.STEPS[2]: [2.0, 1.0],
                     tracing.STEPS[3]: [1.5, 3.0], tracing.STEPS[4]: [2.5, 1.0]}


def test_cpu_breakdown_takes_each_process_s_cpu_steps_and_sums_a_round():
    def client(round_, entered, set_up, done):
        return {"kind": "clientapp", "round": round_, "process_start": None, "entered": 0.0, "set_up": 0.0,
                "done": 0.0, "cpu": {"entered": entered, "set_up": set_up, "done": done}}

    lines = [client(1, 9.0, 9.0, 9.0), client(2, 2.0, 2.5, 3.0), client(2, 1.5, 1.75, 2.0), client(3, 2.0, 2.25, 2.5),
             {"kind": "clientapp", "round": 3, "process_start": None, "entered": 0.0, "set_up": 0.0, "done": 0.0}]
    cpu = tracing.cpu_breakdown("\n".join(json.dumps(line) for line in lines), first_round=2)
    assert cpu == {tracing.STEPS[1]: [2.0, 1.5, 2.0], tracing.STEPS[2]: [0.5, 0.25, 0.25],
                   tracing.STEPS[3]: [0.5, 0.25, 0.25], tracing.ROUND_CPU: [5.0, 2.5]}


def test_a_traced_client_message_records_its_wall_and_cpu_times(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from pfedes import client_app

    path = tmp_path / "trace.jsonl"
    monkeypatch.setenv(tracing.TRACE_ENV, str(path))
    entered = tracing.clock()
    set_up = tracing.clock()
    client_app._trace("train", SimpleNamespace(device="phone"), 2, entered, set_up)
    line = json.loads(path.read_text())
    assert (line["entered"], line["set_up"]) == (entered[0], set_up[0]) and line["done"] >= set_up[0]
    assert line["cpu"]["entered"] == entered[1] <= line["cpu"]["set_up"] == set_up[1] <= line["cpu"]["done"]
    assert tracing.cpu_breakdown(path.read_text())[tracing.ROUND_CPU] == [line["cpu"]["done"]]
