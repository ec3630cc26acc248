"""Issue 18, "networkx for real or not at all": the forward's timeline as a networkx DAG of copy and compute
events against planner/cost/timeline.py's one pass, on the 1,000-layer x 20-param auto plan.

    python bench/bench_event_dag.py [--layers N]

Builds the plan, then for each of its workloads times (best of 5, wall) ``simulate`` and the same forward as a
networkx DAG (node weights: CPU issue, compute, copy; edges: the streams' order, the trigger events, the
copy-done waits) with its critical path (``dag_longest_path_length``), checks that both give the same step
time, and counts how many forwards strategy auto simulates for one plan. Needs networkx (not a dependency of
the planner: ``pip install networkx``). Prints one JSON line per measurement, the cold import of networkx
last. The CPU-bound MoE layers (a routing read back mid-layer) are not modelled here: the synthetic spec has
none.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from synthetic_spec import synthetic_spec_text  # noqa: E402


def event_dag(work, copies):
    """The forward of ``simulate(work, copies)`` as a DAG whose longest path is its step time."""
    import networkx as nx

    g = nx.DiGraph()
    n = len(work)
    by_trigger: dict[int, list] = {}
    for c in copies:
        by_trigger.setdefault(c.trigger, []).append(c)
    for group in by_trigger.values():
        group.sort(key=lambda c: c.layer + (n if c.previous_forward else 0))
    waits = {c.layer: c for c in copies if not c.previous_forward}
    g.add_node("start", w=0.0)
    last_copy = "start"
    for x in range(n):
        before = f"before{x}"  # the event recorded on the compute stream just before layer x
        g.add_node(before, w=0.0)
        g.add_edge(f"done{x - 1}" if x else "start", before)
        g.add_edge(f"issue{x - 1}" if x else "start", before)
        for c in by_trigger.get(x, ()):
            node = f"copy{c.layer}"
            g.add_node(node, w=work[c.layer].copy_ms)
            g.add_edge(before, node)
            g.add_edge(last_copy, node)
            last_copy = node
        g.add_node(f"issue{x}", w=work[x].cpu_ms)
        g.add_edge(f"issue{x - 1}" if x else "start", f"issue{x}")
        g.add_node(f"compute{x}", w=work[x].gpu_ms)
        g.add_edge(before, f"compute{x}")
        if x in waits:
            g.add_edge(f"copy{x}", f"compute{x}")
        g.add_node(f"done{x}", w=0.0)
        g.add_edge(f"compute{x}", f"done{x}")
        g.add_edge(f"issue{x}", f"done{x}")
    g.add_node("end", w=0.0)
    for last in (f"done{n - 1}", f"issue{n - 1}", last_copy):
        g.add_edge(last, "end")
    for u, v in g.edges:
        g.edges[u, v]["w"] = g.nodes[v]["w"]  # a node's time on the edges into it
    return g


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=1000)
    opts = ap.parse_args()
    import networkx as nx

    import planner
    import planner.cost.timeline as timeline
    from planner.cost.layer import layers_work, profile_for
    from planner.cost.predict import copies_of
    from schemas.hardware import load_hardware
    from schemas.io import parse_text
    from schemas.spec import SpecFile

    text = synthetic_spec_text(opts.layers, 20)
    spec = SpecFile.model_validate(parse_text(text, "spec"))
    calls = [0]
    real = timeline.simulate

    def counted(*args):
        calls[0] += 1
        return real(*args)

    timeline.simulate = counted
    for module in list(sys.modules.values()):  # the strategy's own reference to the function too
        if getattr(module, "simulate", None) is real:
            module.simulate = counted
    plan = planner.plan(spec, gpu_budget=10 * 2**30)
    print(json.dumps({"what": "forwards simulated for one auto plan", "layers": opts.layers, "calls": calls[0]}))
    hw = load_hardware("h200")
    for row in plan.predictions.workloads:
        work = layers_work(plan.layers, row.tokens, profile_for(hw, row.mode))
        copies = copies_of(plan)

        def best(f):
            times = []
            for _ in range(5):
                t0 = time.perf_counter()
                out = f()
                times.append(time.perf_counter() - t0)
            return min(times), out

        t_sim, tl = best(lambda: real(work, copies))
        t_build, g = best(lambda: event_dag(work, copies))
        t_path, length = best(lambda: nx.dag_longest_path_length(g, weight="w"))
        print(json.dumps({"workload": row.workload, "nodes": g.number_of_nodes(), "edges": g.number_of_edges(),
                          "simulate_ms": round(t_sim * 1e3, 3), "dag_build_ms": round(t_build * 1e3, 3),
                          "critical_path_ms": round(t_path * 1e3, 3), "step_ms": round(tl.step_ms, 4),
                          "dag_step_ms": round(length, 4),
                          "same": abs(length - tl.step_ms) < 1e-9 * max(1, tl.step_ms)}))
    cold = subprocess.run([sys.executable, "-X", "importtime", "-c", "import networkx"], capture_output=True,
                          text=True).stderr.strip().splitlines()[-1]  # "import time: self | cumulative | networkx"
    print(json.dumps({"what": "cold import of networkx", "ms": round(int(cold.split("|")[1]) / 1e3, 1)}))

if __name__ == "__main__":
    main()
