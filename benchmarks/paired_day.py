"""One simulated day timed against another checkout of atoll, alternated on one machine: one JSON
document on stdout (progress on stderr).

A speed change is measured as a paired ratio: the same ``atoll simulate`` command in fresh
processes, this checkout and a baseline checkout taking turns (base, new, base, new, ...), so a
machine whose speed drifts over minutes (this project's shared 2-core machines do, by 20% and
more) weighs on both sides alike. Each pair gives new / base wall seconds; the document has the
pairs, their mean ratio with a 95% t interval (``paired_ratio``, as the contests report) and
each run's totals, so a change that moved the day's cost or SLO shows.

The baseline is a checkout of another commit (``git worktree add <dir> <commit>``) whose
packages are put first on ``PYTHONPATH`` through a folder of symlinks named as the package::

    git worktree add /tmp/base <commit>
    mkdir -p /tmp/baseroot/atoll
    for p in control envs forecast solvers training; do ln -s /tmp/base/$p /tmp/baseroot/atoll/$p; done
    python benchmarks/paired_day.py --baseline /tmp/baseroot --pairs 3 --out result.json

Default command: the fleet20 contest-world day (``speed.py``'s ``fleet20_contest_world_day``).
Pause other work first, or the figure is the load's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from atoll.training.lever_oracle import paired_ratio

FLEET20_CONTEST_DAY = ["simulate", "--scenario", "fleet20", "--days", "11", "--policy", "fixed:1@0.9",
                       "--availability", "spot", "--capacity-error", "calibration", "--correction",
                       "--slo-model", "latency", "--pd", "disaggregated", "--json"]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run(args: list[str], pythonpath: str | None) -> dict[str, Any]:
    """Wall and CPU seconds, peak RSS and the day's totals of one fresh process."""
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    else:
        env.pop("PYTHONPATH", None)
    argv = [sys.executable, "-c", "from atoll.control.cli import main; main()", *args]
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise SystemExit(f"paired_day: {' '.join(args[:3])} exited with {code} "
                         f"(PYTHONPATH={pythonpath or '-'}); run it by hand to see why")
    totals = json.loads(out).get("totals", {})
    return {"wall_s": round(wall, 2), "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
            "peak_rss_mb": round(usage.ru_maxrss / 1024, 1), "totals": totals,
            "load": [round(v, 2) for v in os.getloadavg()]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", required=True, help="PYTHONPATH entry holding the baseline's atoll/ folder")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--command", default=None, help="the atoll arguments, as one string (default: the "
                                                     "fleet20 contest-world day)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if not (Path(args.baseline) / "atoll").is_dir():
        raise SystemExit(f"paired_day: --baseline {args.baseline!r} has no atoll/ folder; make one of "
                         f"symlinks to a checkout's packages (see this script's docstring)")
    if args.pairs < 1:
        raise SystemExit(f"paired_day: --pairs must be >= 1, got {args.pairs}")
    command = args.command.split() if args.command else FLEET20_CONTEST_DAY
    run(command, None)  # warm the caches (the library, the demand and the forecast) once
    pairs = []
    for k in range(args.pairs):
        base = run(command, args.baseline)
        new = run(command, None)
        pairs.append({"base": base, "new": new, "ratio": round(new["wall_s"] / base["wall_s"], 4)})
        log(f"pair {k}: base {base['wall_s']} s, new {new['wall_s']} s")
    same = all(p["base"]["totals"].get("cost_usd") == p["new"]["totals"].get("cost_usd") for p in pairs)
    doc = {"command": "atoll " + " ".join(command), "baseline": args.baseline, "pairs": pairs,
           "ratio": paired_ratio([p["new"]["wall_s"] for p in pairs], [p["base"]["wall_s"] for p in pairs]),
           "same_cost": same, "cpus": os.cpu_count()}
    text = json.dumps(doc, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
