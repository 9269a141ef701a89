"""Where a fresh ClientApp process spends its time on pfedes' side, without Flower's transport:
the interpreter start, `import pfedes.client_app` (the module `[tool.flwr.app.components]`
names), and the train handler's steps (data, model and private state, the work, the save).

    python scripts/measure_startup.py [--repeats 3] [--samples 100] [--out startup.json]
    python scripts/measure_startup.py --tree before=/tmp/old-checkout --tree after=. --out startup.json

Every measurement is a new Python process, as Flower 1.42 starts one per message. With several
`--tree NAME=DIR` (source trees of pfedes, e.g. an export of an older commit) the processes of
the trees alternate, so that they share the machine's load alike: compare them by their ratio.

Per device profile (phone, gateway, gpu-host: cnn3, resnet_bn, vit_small) the first process finds
an empty state directory (it decodes the partition and writes the decoded-data cache), the later
ones are the steady state of a deployment: the cache and the private state from the previous
round. Each step is timed by the wall clock and by the process's CPU time (user + system; the exit's from
the child's resource usage), which a loaded machine disturbs much less than the wall clock. The report also lists the heavy modules each
process imported (torch._dynamo, datasets, ...).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEVICES = ("phone", "gateway", "gpu-host")
WATCHED = ("torch._dynamo", "datasets", "flwr_datasets", "pyarrow", "PIL", "torchvision", "matplotlib",
           "pandas", "scipy", "omegaconf", "hydra", "ray")

# The child: one fresh process, one train message through the ClientApp's handler.
CHILD = r"""
import json, sys, time
marks = [("started", time.time(), time.process_time())]
def mark(name):
    marks.append((name, time.time(), time.process_time()))
import pfedes.client_app as client_app
mark("import pfedes.client_app")
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.supercore.task_identity import TaskIdentity

spec = json.loads(sys.argv[1])
TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
arrays = torch.load(spec["arrays"], weights_only=True)
msg = Message(content=RecordDict({"arrays": ArrayRecord(arrays), "config": ConfigRecord(
    {"experiment": spec["experiment"], "server-round": spec["round"]})}), dst_node_id=1, message_type="train")
ctx = Context(run_id=1, node_id=1, node_config=spec["node_config"], state=RecordDict(), run_config={})
mark("message (stands in for Flower's)")

def timed(name, fn):
    def wrapper(*args, **kwargs):
        out = fn(*args, **kwargs)
        mark(name)
        return out
    return wrapper

client_app.load_node_data = timed("data", client_app.load_node_data)
client_app.STORE.get = timed("model and private state", client_app.STORE.get)
client_app.train_round = timed("work: train", client_app.train_round)
client_app.STORE.save = timed("private state saved", client_app.STORE.save)
reply = client_app.train(msg, ctx)
mark("reply")
assert not reply.has_error(), reply.error.reason
print(json.dumps({"marks": marks, "modules": [m for m in spec["watched"] if m in sys.modules]}))
"""


def experiment(args: argparse.Namespace, out_dir: Path) -> tuple[dict, dict[str, Path]]:
    """What the ServerApp sends: the client settings, and each device's initial shared arrays."""
    import torch

    from pfedes.config import client_settings, experiment_config
    from pfedes.data import image_format, num_classes_of
    from pfedes.methods import method_of
    from pfedes.models import resolve_architecture
    from pfedes.server_app import prepare

    cfg = prepare(experiment_config([f"num_clients={len(DEVICES)}", f"data.samples_per_client={args.samples}",
                                     "train.torch_threads=1", "evaluate_in_train=true", f"out_dir={out_dir}",
                                     f"data.path={args.data}"]))
    cfg["run_token"] = "measure-startup"
    source_fmt, classes = image_format(cfg["data"]["path"]), num_classes_of(cfg["data"]["path"])
    arrays = {}
    for device in DEVICES:
        arch = resolve_architecture(device, cfg["model"]["profiles"])
        arrays[device] = out_dir / f"initial-{device}.pt"
        torch.save(method_of(cfg).trainer.initial_shared(cfg, arch, classes, image=source_fmt), arrays[device])
    return client_settings(cfg), arrays


def one_process(tree: Path, settings: dict, arrays: Path, node_config: dict, server_round: int) -> dict:
    spec = {"experiment": json.dumps(settings, sort_keys=True), "arrays": str(arrays), "round": server_round,
            "node_config": node_config, "watched": list(WATCHED)}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")]))}
    env.pop("PFEDES_TRACE", None)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    spawned = time.time()
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(spec)], capture_output=True, text=True, env=env,
                         cwd=tree)
    ended = time.time()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if out.returncode:
        raise SystemExit(f"the child process failed:\n{out.stderr[-3000:]}")
    child = json.loads(out.stdout.strip().splitlines()[-1])
    marks = child["marks"]
    steps = {"interpreter start": {"wall": marks[0][1] - spawned, "cpu": marks[0][2]}}
    for (_, wall0, cpu0), (name, wall1, cpu1) in zip(marks, marks[1:]):
        steps[name] = {"wall": wall1 - wall0, "cpu": cpu1 - cpu0}
    steps["process exit"] = {"wall": ended - marks[-1][1], "cpu": max(0.0, cpu - marks[-1][2])}
    return {"steps": steps, "total_wall": ended - spawned, "total_cpu": cpu, "modules": child["modules"]}


def median_steps(runs: list[dict]) -> dict:
    names = list(runs[0]["steps"])
    out = {}
    for name in names:
        walls = [r["steps"][name]["wall"] for r in runs]
        cpus = [r["steps"][name]["cpu"] for r in runs]
        out[name] = {"wall": round(statistics.median(walls), 3), "cpu": round(statistics.median(cpus), 3)}
    return out


def summarise(first: dict, later: list[dict]) -> dict:
    return {"first_process": {"steps": median_steps([first]), "total_wall": round(first["total_wall"], 3),
                              "total_cpu": round(first["total_cpu"], 3), "modules": first["modules"]},
            "later_processes_median": {
                "steps": median_steps(later),
                "total_wall": round(statistics.median(r["total_wall"] for r in later), 3),
                "total_cpu": round(statistics.median(r["total_cpu"] for r in later), 3),
                "modules": later[0]["modules"]}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes per device after the first")
    parser.add_argument("--samples", type=int, default=100, help="data.samples_per_client")
    parser.add_argument("--data", default="embedded")
    parser.add_argument("--tree", action="append", default=[], metavar="NAME=DIR",
                        help="a pfedes source tree to measure (repeatable; default: this one)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    trees = dict(t.split("=", 1) for t in args.tree) or {"this": str(ROOT)}
    trees = {name: Path(directory).resolve() for name, directory in trees.items()}

    result = {"command": " ".join(["python", "scripts/measure_startup.py", *sys.argv[1:]]),
              "trees": {name: str(tree) for name, tree in trees.items()}, "loadavg_before": os.getloadavg(),
              "devices": {}}
    with tempfile.TemporaryDirectory(prefix="pfedes-startup-") as tmp:
        tmp = Path(tmp)
        settings, arrays = experiment(args, tmp)
        for index, device in enumerate(DEVICES):
            node = {name: {"device": device, "state-dir": str(tmp / name / "state" / device), "partition-id": index,
                           "num-partitions": len(DEVICES)} for name in trees}
            first = {name: one_process(tree, settings, arrays[device], node[name], 1) for name, tree in trees.items()}
            later: dict[str, list[dict]] = {name: [] for name in trees}
            for server_round in range(2, 2 + args.repeats):  # the trees alternate
                for name, tree in trees.items():
                    later[name].append(one_process(tree, settings, arrays[device], node[name], server_round))
            result["devices"][device] = {name: summarise(first[name], later[name]) for name in trees}
            for name in trees:
                print(device, name, json.dumps(result["devices"][device][name]["later_processes_median"]), flush=True)
    result["loadavg_after"] = os.getloadavg()
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")

if __name__ == "__main__":
    main()
