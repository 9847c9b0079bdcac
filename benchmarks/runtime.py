"""What the serving runtime costs: template counts and ILP plan cost per scenario under
``runtime: vllm`` (pipelines stock vLLM can run) against ``runtime: any`` (every pipeline shape),
as one JSON document on stdout.

For each scenario (core, extended) and runtime: templates in the scenario's library (its own
request shapes, default cache), and the exact ILP's $/h under ample availability for each mix
(cost mode). ``cost_ratio`` = vllm / any.

    .venv/bin/python benchmarks/runtime.py [--scenarios core,extended] [--mixes even,large-heavy,small-heavy]
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from atoll.solvers.allocation import solve_allocation
from atoll.solvers.runtime import RUNTIMES
from atoll.solvers.scenarios import SCENARIOS, build_problem, scenario_templates


def measure(scenario: str, mixes: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for runtime in RUNTIMES:
        t0 = time.perf_counter()
        templates = scenario_templates(SCENARIOS[scenario], runtime=runtime, slices=False)  # whole nodes
        load_s = time.perf_counter() - t0
        row: dict[str, Any] = {"templates": len(templates), "library_seconds": round(load_s, 2),
                               "multi_node_templates": sum(t.node_count > 1 for t in templates),
                               "cost_per_hour": {}, "status": {}}
        for mix in mixes:
            problem = build_problem(scenario, "ample", mix, templates=templates)
            res = solve_allocation(problem)
            row["cost_per_hour"][mix] = None if res.allocation is None else round(res.cost_per_hour, 4)
            row["status"][mix] = res.status.value
        out[runtime] = row
    out["cost_ratio_vllm_over_any"] = {
        m: (None if not out["any"]["cost_per_hour"][m] or out["vllm"]["cost_per_hour"][m] is None
            else round(out["vllm"]["cost_per_hour"][m] / out["any"]["cost_per_hour"][m], 4)) for m in mixes}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenarios", default="core,extended")
    ap.add_argument("--mixes", default="even,large-heavy,small-heavy")
    args = ap.parse_args()
    mixes = args.mixes.split(",")
    doc = {"scenarios": {s: measure(s, mixes) for s in args.scenarios.split(",")}}
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
