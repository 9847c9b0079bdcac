"""Start-up time of the ``atoll`` command: wall seconds of ``atoll --help``, ``atoll --version``
and each command's ``--help`` (a fresh interpreter each, best and median of a few runs), and the
heavy libraries each command's module imports. Prints one JSON document and writes it to
benchmarks/results/cli.json.

    python benchmarks/cli_startup.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HEAVY = ("torch", "stable_baselines3", "mlflow", "ray", "gymnasium", "pandas", "statsmodels", "scipy",
         "matplotlib", "highspy", "pulp", "numpy")
RESULTS = Path(__file__).resolve().parent / "results" / "cli.json"


def wall(argv: list[str], repeats: int) -> dict[str, float]:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        times.append(time.perf_counter() - t0)
    return {"best_s": round(min(times), 4), "median_s": round(statistics.median(times), 4)}


def heavy_imports(module: str) -> list[str]:
    code = (f"import sys, importlib; importlib.import_module('atoll.control.cli.{module}'); "
            f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return [m for m in out.strip().split(",") if m]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="runs per figure (default 5)")
    args = parser.parse_args()
    from atoll.control.cli import COMMANDS

    atoll = [sys.executable, "-m", "atoll.control.cli"]
    load_before = os.getloadavg()
    doc = {
        "atoll --help": wall([*atoll, "--help"], args.repeats),
        "atoll --version": wall([*atoll, "--version"], args.repeats),
        "python -c pass": wall([sys.executable, "-c", "pass"], args.repeats),
        "commands": {name: {**wall([*atoll, name, "--help"], max(1, args.repeats // 2)),
                            "heavy_imports": heavy_imports(module)}
                     for name, (module, _) in COMMANDS.items()},
        "target_help_s": 0.5,
        "loadavg_before": load_before, "loadavg_after": os.getloadavg(), "cpus": os.cpu_count(),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
