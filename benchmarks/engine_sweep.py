"""Why the simulation's server process costs more per round with more virtual clients (issue 15,
fleet scale): the CPU of Flower 1.42's simulation engine polling its nodes.

The engine (`flwr/server/superlink/fleet/vce/vce_api.py`, `add_messages_to_queue`) sweeps over
every registered node ten times a second and asks the in-memory LinkState for that node's next
message (`InMemoryLinkState.get_message_ins(node_id, limit=1)`), which walks every stored message
and checks each one (`_check_stored_messages`). One sweep costs O(nodes x messages in flight),
paid in the server's process for as long as a round's messages are out, whatever pfedes does.
This script builds the engine's own LinkState with N registered nodes (the engine's
`_register_nodes`) and 10 train messages delivered and in flight (the scale benchmark's 10
sampled clients), then times sweeps of the engine's loop, CPU seconds.

    python benchmarks/engine_sweep.py [--nodes 10 100 1000] [--sweeps 20]

writes benchmarks/results/engine_sweep.json (with the flwr version). It uses Flower's internals
as 1.42 has them, so it states what 1.42 does; a SuperLink in deployment has no such sweep
(each SuperNode asks for its own messages).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import print_table, write_result  # noqa: E402

IN_FLIGHT = 10  # messages out at once: the scale benchmark's sampled clients per round
SWEEPS_PER_S = 10  # the engine waits 0.1 s between two sweeps (f_stop.wait(0.1))


def engine_state(nodes: int, in_flight: int):
    """(the engine's LinkState with `nodes` registered nodes and `in_flight` train messages pushed to
    the first nodes and delivered, the node ids)."""
    from flwr.app import Message, RecordDict
    from flwr.proto.task_pb2 import Task  # pylint: disable=no-name-in-module
    from flwr.server.superlink.fleet.vce.vce_api import _register_nodes
    from flwr.server.superlink.linkstate import LinkStateFactory
    from flwr.server.superlink.linkstate.in_memory_linkstate import RunRecord
    from flwr.superlink.federation import NoOpFederationManager
    from flwr.superlink.federation.noop_federation_manager import NOOP_FEDERATION_ID
    from flwr.superlink.grid.inmemory_grid import InMemoryGrid
    from flwr.supercore.constant import FLWR_IN_MEMORY_DB_NAME
    from flwr.supercore.object_store import ObjectStoreFactory
    from flwr.supercore.run import Run
    from flwr.supercore.task_identity import TaskIdentity

    factory = LinkStateFactory(FLWR_IN_MEMORY_DB_NAME, NoOpFederationManager(), ObjectStoreFactory())
    mapping = _register_nodes(nodes, factory)
    state = factory.state()
    run = Run.create_empty(run_id=7)  # registered as run_simulation registers its run
    run.primary_task_id, run.federation_id = 9, NOOP_FEDERATION_ID
    state.run_ids[run.run_id] = RunRecord(run=run)
    state.task_store[9] = Task(task_id=9, run_id=run.run_id)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = run.run_id, 1, 9  # the SuperLink's
    grid = InMemoryGrid(state_factory=factory)
    grid.set_run(run)
    targets = list(mapping)[:in_flight]
    pushed = list(grid.push_messages([Message(RecordDict(), dst_node_id=n, message_type="train") for n in targets]))
    for node_id in targets:  # the engine hands them to the ClientApps: delivered, awaiting replies
        state.get_message_ins(node_id=node_id, limit=1)
    return state, list(mapping), len(pushed)


def sweep_cpu(nodes: int, sweeps: int, in_flight: int = IN_FLIGHT) -> dict:
    state, node_ids, pushed = engine_state(nodes, in_flight)
    start = time.process_time()
    for _ in range(sweeps):
        for node_id in node_ids:  # vce_api.add_messages_to_queue's loop body
            state.get_message_ins(node_id=node_id, limit=1)
    per_sweep = (time.process_time() - start) / sweeps
    return {"nodes": nodes, "messages_in_flight": pushed, "cpu_ms_per_sweep": 1000 * per_sweep,
            "cpu_s_per_s_at_10_sweeps": per_sweep * SWEEPS_PER_S}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--sweeps", type=int, default=20)
    parser.add_argument("--out", type=Path, default=None, help="directory of engine_sweep.json (default: benchmarks/results)")
    args = parser.parse_args(argv)
    import flwr

    rows = [sweep_cpu(n, args.sweeps) for n in args.nodes]
    print_table(rows, ["nodes", "messages_in_flight", "cpu_ms_per_sweep", "cpu_s_per_s_at_10_sweeps"])
    result = {"benchmark": "engine_sweep", "flwr": flwr.__version__, "sweeps": args.sweeps, "rows": rows}
    write_result("engine_sweep", result, args.out)
    return result


if __name__ == "__main__":
    main()
