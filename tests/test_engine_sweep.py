"""benchmarks/engine_sweep.py builds Flower's simulation engine state as the engine does and runs
its sweep: it pins that the internals it measures are still there (no timing is asserted)."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import engine_sweep  # noqa: E402


def test_the_sweep_runs_on_the_engines_own_state_with_messages_in_flight(tmp_path):
    result = engine_sweep.main(["--nodes", "4", "30", "--sweeps", "2", "--out", str(tmp_path)])
    rows = {r["nodes"]: r for r in result["rows"]}
    assert rows[4]["messages_in_flight"] == 4 and rows[30]["messages_in_flight"] == engine_sweep.IN_FLIGHT
    assert all(r["cpu_ms_per_sweep"] >= 0 for r in rows.values())
    state, nodes, pushed = engine_sweep.engine_state(3, 2)
    assert len(nodes) == 3 and pushed == 2
    assert state.get_message_ins(node_id=nodes[0], limit=1) == []  # delivered already: in flight
    assert json.loads((tmp_path / "engine_sweep.json").read_text())["flwr"].startswith("1.42")
