"""Figures of the template library, as one JSON document on stdout.

For the ``core`` and ``extended`` libraries (:data:`atoll.solvers.templates.SCENARIO_LIBRARIES`, default
request shape): cold build seconds into a fresh temporary cache folder (targets: core <= 60 s,
extended <= 900 s on 2 cores), multisets placed exactly, templates kept per service, and the
seconds of a warm build (everything loaded from that cache).

    .venv/bin/python benchmarks/templates.py [--only core|extended] [--workers N]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from atoll.solvers.templates import SCENARIO_LIBRARIES, build_library, enumerate_multisets

TARGET_SECONDS = {"core": 60.0, "extended": 900.0}


def measure(name: str, workers: int) -> dict[str, Any]:
    spec = SCENARIO_LIBRARIES[name]
    placed = sum(len(enumerate_multisets(j.model, j.configs, j.n_max, j.rho, j.shape)) for j in spec.jobs())
    with tempfile.TemporaryDirectory(prefix="atoll-templates-") as tmp:
        t0 = time.perf_counter()
        cold = build_library(spec, cache_dir=Path(tmp), workers=workers, progress=False)
        cold_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        warm = build_library(spec, cache_dir=Path(tmp), workers=workers, progress=False)
        warm_s = time.perf_counter() - t0
    if cold.from_cache or not warm.from_cache or warm.templates != cold.templates:
        raise RuntimeError(f"{name}: the warm build did not reproduce the cold one from the cache")
    return {
        "spec": spec.to_json(), "jobs": len(spec.jobs()), "multisets_placed": placed,
        "templates_per_service": cold.counts(), "total_templates": len(cold.templates),
        "cold_build_seconds": cold_s, "warm_load_seconds": warm_s,
        "target_cold_seconds": TARGET_SECONDS[name], "target_met": cold_s <= TARGET_SECONDS[name],
        "cache_key": cold.key,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=sorted(SCENARIO_LIBRARIES))
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    names = [args.only] if args.only else ["core", "extended"]
    doc = {"workers": args.workers, "cpu_count": os.cpu_count(),
           **{name: measure(name, args.workers) for name in names}}
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
