"""Long fuzz run of the input paths (issue 18): the user catalog file loader, the /metrics parser
path and the Prometheus API answer path, each through the same targets as the Hypothesis tests
(tests/fuzz_targets.py). Prints one JSON document: per target, examples tried and the distinct
unintended exceptions found (anything not an AtollError), with one example message each.

    python benchmarks/fuzz.py [--examples 20000]
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

from fuzz_targets import (  # noqa: E402
    CatalogTarget,
    bodies,
    catalog_inputs,
    metrics_target,
    pages,
    prometheus_target,
)
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from atoll.solvers.errors import AtollError  # noqa: E402


def run(name: str, strategy: st.SearchStrategy[Any], target: Any, examples: int) -> dict[str, Any]:
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
    return {"examples": tried[0], "project_errors": expected[0], "unintended_exceptions": len(found),
            "unintended": found, "seconds": round(time.perf_counter() - t, 1)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--examples", type=int, default=20_000)
    args = parser.parse_args()
    catalog = CatalogTarget()
    out = {
        "catalog_user_file": run("catalog", st.tuples(catalog_inputs, st.sampled_from([".yaml", ".toml"])),
                                 lambda v: catalog(*v), args.examples),
        "metrics_page": run("metrics", st.lists(pages, min_size=1, max_size=3), metrics_target,
                            args.examples),
        "prometheus_answer": run("prometheus", st.tuples(bodies, bodies, bodies), prometheus_target,
                                 args.examples),
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
