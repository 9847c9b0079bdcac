"""Long fuzz run of the input paths: the user catalog file loader, the /metrics parser
path, the Prometheus API answer path and the fleet file loader, and the metamorphic cases of a
request log and fleet (``metamorphic``, counting silent misreadings), each through the
same targets as the Hypothesis tests (tests/fuzz_targets.py). Prints one JSON document: per
target, examples tried and the distinct unintended exceptions found (anything not an AtollError),
with one example message each.

    python benchmarks/fuzz.py [--examples 20000] [--targets fleet_file,metrics_page]

``--targets`` runs only the named targets (default: all); merging a partial run's figures into
benchmarks/results/fuzz.json is left to the caller.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(REPO / "tests"))

import fuzz_targets as targets  # noqa: E402  (the tests' targets, run longer here)
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from atoll.solvers.errors import AtollError  # noqa: E402


def run(name: str, strategy: st.SearchStrategy[Any], target: Any, examples: int,
        extra: Any = None) -> dict[str, Any]:
    tried = [0]
    expected = [0]
    found: dict[str, str] = {}

    @settings(max_examples=examples, deadline=None, database=None, derandomize=False,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def check(value: Any) -> None:
        tried[0] += 1
        try:
            target(value)
        except AtollError:
            expected[0] += 1
        except Exception as exc:  # noqa: BLE001 - counting them is the point
            where = traceback.extract_tb(exc.__traceback__)[-1]
            key = f"{type(exc).__name__} at {Path(where.filename).name}:{where.lineno}"
            found.setdefault(key, f"{exc!s}"[:200])

    t = time.perf_counter()
    check()
    print(f"{name}: {tried[0]} examples, {len(found)} unintended", file=sys.stderr, flush=True)
    out = {"examples": tried[0], "project_errors": expected[0], "unintended_exceptions": len(found),
           "unintended": found, "seconds": round(time.perf_counter() - t, 1)}
    return out | (extra() if extra else {})


def catalog_user_file(examples: int) -> dict[str, Any]:
    catalog = targets.CatalogTarget()
    return run("catalog", st.tuples(targets.catalog_inputs, st.sampled_from([".yaml", ".toml"])),
               lambda v: catalog(*v), examples)


def metrics_page(examples: int) -> dict[str, Any]:
    return run("metrics", st.lists(targets.pages, min_size=1, max_size=3), targets.metrics_target, examples)


def prometheus_answer(examples: int) -> dict[str, Any]:
    body = targets.bodies
    return run("prometheus", st.tuples(body, body, body), targets.prometheus_target, examples)


def fleet_file(examples: int) -> dict[str, Any]:
    # Fleets whose workloads are request logs or ServeGen traces (read once, then cached) are
    # also activated; Azure traces are left to the loader alone (slow to read).
    fleet = targets.FleetTarget(activate_kinds=("csv", "servegen"))
    return run("fleet_file", targets.fleet_inputs, fleet, examples,
               extra=lambda: {"loaded": fleet.loaded, "activated": fleet.activated})


def metamorphic(examples: int) -> dict[str, Any]:
    """Seeded log + fleet, each case one perturbation (tests/metamorphic_targets.py);
    a neutral one must leave the demand solve and simulate get unchanged, a corrupting one must
    give that or an AtollError. Counts the silent misreadings (anything else)."""
    from metamorphic_targets import KINDS, MetamorphicTarget

    target = MetamorphicTarget()
    per_kind: dict[str, dict[str, int]] = {k: {"same": 0, "error": 0, "misread": 0} for k in KINDS}
    examples_of: dict[str, str] = {}
    t = time.perf_counter()
    for i in range(examples):
        kind = KINDS[i % len(KINDS)]
        out = target(i // len(KINDS), kind)
        per_kind[kind][out.result] += 1
        if out.result == "misread":
            examples_of.setdefault(kind, out.detail)
    misread = sum(v["misread"] for v in per_kind.values())
    print(f"metamorphic: {target.tried} cases, {misread} silent misreadings", file=sys.stderr, flush=True)
    return {"examples": target.tried, "silent_misreadings": misread, "errors": target.errors,
            "per_kind": per_kind, "misread_examples": examples_of,
            "seconds": round(time.perf_counter() - t, 1)}


TARGETS = {f.__name__: f for f in (catalog_user_file, metrics_page, prometheus_answer, fleet_file,
                                    metamorphic)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--examples", type=int, default=20_000)
    parser.add_argument("--targets", default=",".join(TARGETS),
                        help=f"comma-separated targets to run (default all: {', '.join(TARGETS)})")
    args = parser.parse_args()
    names = [n.strip() for n in args.targets.split(",") if n.strip()]
    unknown = [n for n in names if n not in TARGETS]
    if unknown or not names:
        parser.error(f"unknown target(s) {unknown}; valid: {', '.join(TARGETS)}")
    print(json.dumps({n: TARGETS[n](args.examples) for n in names}, indent=2))


if __name__ == "__main__":
    main()
