"""A rule switched by the fleet's state, against the per-model rule, where the room is: one JSON
document on stdout (progress on stderr), one key per cell in ``--out``.

Per cell (``--cells``, as in ``benchmarks/room.py``, whose run folder or ``room.json`` must hold
the cell's test-day seeds: the per-model rule's figures are paired from there):

1. **Choose on validation days 8-10** (``--validation-seeds`` seeds, never the test days): every
   switched rule of the grid (:mod:`atoll.training.switched_rule`; calm and alert presets of the
   room's ``fixed:1@0.9`` family, each ordered pair, on the signal "one of the model's instances
   was preempted within the last W steps", W in ``--windows``), beside the per-model rule and
   the uniform presets on the same seeds. The rule of least effective cost (node $ + the lost
   tokens' price) is chosen. Every switched rule makes its first plan at the per-model rule's
   level and risk, so the two start from the same plan.
2. **Report on test days 11-14**: the chosen rule on ``--seeds`` seeds, each paired with the
   per-model rule on the same seed (same demand, availability and preemption draws, and first
   plan): the room's figure for its seeds, a run of it here for seeds past them. Seed 0's
   per-model rule is run again first, as a check that the stored figure reproduces; where it
   does not (the room was measured by an earlier version), the per-model rule runs here on
   every seed.
   The comparisons with the room's references (the test days' best preset, the lever oracle)
   are over the room's seeds.

    .venv/bin/python benchmarks/switched.py --cells core/hedged/charged,core/hedged/charged/bursty \\
        --run-dir benchmarks/runs/switched --out benchmarks/results/switched.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

# Run as a script, this file's folder leads sys.path and its name would shadow the package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import numpy as np  # noqa: E402

from atoll.envs import WORLDS  # noqa: E402
from atoll.envs.config import FleetConfig  # noqa: E402
from atoll.envs.fleet_env import FleetEnv  # noqa: E402
from atoll.envs.vocabulary import parse_policy  # noqa: E402
from atoll.solvers.files import atomic_write_text  # noqa: E402
from atoll.training.contest import ContestSettings  # noqa: E402
from atoll.training.evaluate import resolve_policy  # noqa: E402
from atoll.training.lever_oracle import measured, paired_ratio, preset_of  # noqa: E402
from atoll.training.switched_rule import Signal, SwitchedRule, describe, uniform  # noqa: E402

PRESETS = ("fixed:1@0.9", "fixed:1@0.9+h0.85", "fixed:1@0.9+h0.7")
VALIDATION_DAYS = [8, 9, 10]
TEST_DAYS = [11, 12, 13, 14]


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def cell_config(key: str) -> FleetConfig:
    parts = key.split("/")
    scenario, availability, world = parts[:3]
    workload = f"servegen-{parts[3]}" if len(parts) > 3 else "servegen"
    # a replica per phase, as the room's cells it pairs with were measured
    return FleetConfig(scenario=scenario, availability=availability, workload=workload, pd="disaggregated",
                       action_levels=(0.9,),
                       days=(VALIDATION_DAYS[0], TEST_DAYS[-1]), **WORLDS[world])


def grid(windows: list[int], n_models: int, per_model: str) -> dict[str, SwitchedRule]:
    """Every switched rule of the grid, each starting from the per-model rule's first plan."""
    reference = resolve_policy(parse_policy(per_model), n_models)
    first = (reference.planning_quantile, reference.risk)
    out = {}
    for (calm, alert), w in itertools.product(itertools.permutations(PRESETS, 2), windows):
        signal = Signal("since_preempt", w / 288)
        name = describe([calm], [alert], signal)
        out[name] = uniform(preset_of(parse_policy(calm)), preset_of(parse_policy(alert)), signal, n_models,
                            name=name, first=first)
    return out


def job(config: FleetConfig, name: str, windows: list[int], per_model: str, days: list[int], seed: int,
        lost: float) -> tuple[str, int, dict[str, float]]:
    """One policy (a switched rule of the grid, the per-model rule or a preset) on one seed."""
    env = FleetEnv(config)
    rules = grid(windows, len(env.models), per_model)
    policy = rules[name] if name in rules else resolve_policy(parse_policy(name), len(env.models))
    return name, seed, measured(env, policy, days=days, seed=seed, lost_usd_per_mtok=lost)[1]


def run_cell(key: str, args: argparse.Namespace) -> dict[str, Any]:
    room_dir = args.room_dir / key.replace("/", "-")
    # the room's own seeds pair with its per-model rule; seeds past them run that rule here. They
    # are in the cell's run folder, or (a cell run without one) in room.json's per-seed rows
    room_doc = json.loads(args.room_out.read_text())
    if key not in room_doc:
        raise SystemExit(f"{args.room_out} has no cell {key!r}; run benchmarks/room.py --cells {key} first")
    room_rows = [json.loads(p.read_text()) for k in range(args.seeds)
                 if (p := room_dir / f"seed-{k}.json").exists()] or room_doc[key]["per_seed"][: args.seeds]
    folder = args.run_dir / key.replace("/", "-")
    folder.mkdir(parents=True, exist_ok=True)
    config = cell_config(key)
    lost = ContestSettings(validation_days=(8, 10), test_days=(11, 14)).lost_price(config)
    env = FleetEnv(config)  # the demand and forecast caches, once, before the workers read them
    windows = [int(w) for w in args.windows.split(",")]
    per_model = room_doc[key]["per_model_rule"]
    rules = grid(windows, len(env.models), per_model)
    t0 = time.perf_counter()
    vfile = folder / "validation.json"
    validation: dict[str, dict[str, Any]] = json.loads(vfile.read_text()) if vfile.exists() else {}
    names = [*rules, per_model, *PRESETS]
    vseeds = range(args.validation_seeds)
    todo = [(n, s) for n in names for s in vseeds if str(s) not in validation.get(n, {})]
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        futures = [pool.submit(job, config, n, windows, per_model, VALIDATION_DAYS, s, lost) for n, s in todo]
        for i, f in enumerate(futures):
            name, seed, totals = f.result()
            validation.setdefault(name, {})[str(seed)] = totals
            atomic_write_text(vfile, json.dumps(validation, indent=1) + "\n")
            log(f"{key}: validation {i + 1}/{len(futures)} {name} seed {seed}: "
                f"${totals['effective_usd']:.0f}")
        v_cost = {n: float(np.mean([validation[n][str(s)]["effective_usd"] for s in vseeds])) for n in names}
        chosen = min(rules, key=lambda n: v_cost[n])
        log(f"{key}: chosen on validation days: {chosen} (${v_cost[chosen]:.0f}; per-model rule "
            f"${v_cost[per_model]:.0f})")
        tfile = folder / "test.json"
        test: dict[str, Any] = json.loads(tfile.read_text()) if tfile.exists() else {}
        if test.get("chosen") not in (None, chosen):
            raise SystemExit(f"{tfile} holds test runs of {test['chosen']!r}, not {chosen!r}; move it away")
        test["chosen"] = chosen
        runs = test.setdefault("runs", {})
        reference = test.setdefault("reference", {})
        if "check" not in test:  # first: does the room's stored per-model rule reproduce here?
            _, _, totals = job(config, per_model, windows, per_model, TEST_DAYS, 0, lost)
            stored = room_rows[0]["per_model_rule"]
            test["check"] = {"per_model_rule_seed_0": totals, "stored": stored,
                             "reproduces": abs(totals["effective_usd"] - stored["effective_usd"]) < 0.01}
            atomic_write_text(tfile, json.dumps(test, indent=1) + "\n")
            log(f"{key}: the room's per-model rule, seed 0: ${totals['effective_usd']:.2f} here, "
                f"${stored['effective_usd']:.2f} stored")
        if not test["check"].get("reproduces", True):
            # the room was measured by an earlier version: pair with the per-model rule run here
            n_pair = 0
            reference["0"] = test["check"]["per_model_rule_seed_0"]
        else:
            n_pair = len(room_rows)
        todo_t = [(chosen, s) for s in range(args.seeds) if str(s) not in runs]
        todo_t += [(per_model, s) for s in range(n_pair, args.seeds) if str(s) not in reference]
        futures = [pool.submit(job, config, n, windows, per_model, TEST_DAYS, s, lost) for n, s in todo_t]
        for f in futures:
            name, seed, totals = f.result()
            if name == per_model:
                reference[str(seed)] = totals
            else:
                runs[str(seed)] = totals
            atomic_write_text(tfile, json.dumps(test, indent=1) + "\n")
            log(f"{key}: test {name} seed {seed}: ${totals['effective_usd']:.0f}")
    rows = [runs[str(k)] for k in range(args.seeds)]
    n_room = len(room_rows)
    ref = [reference[str(k)] if str(k) in reference else room_rows[k]["per_model_rule"]
           for k in range(args.seeds)]
    best_preset = min(PRESETS, key=lambda p: np.mean([r[p]["effective_usd"] for r in room_rows]))
    return {
        "cell": key, "validation_days": VALIDATION_DAYS, "validation_seeds": args.validation_seeds,
        "test_days": TEST_DAYS, "seeds": args.seeds, "per_model_rule": per_model,
        "validation_effective_usd": dict(sorted(v_cost.items(), key=lambda kv: kv[1])), "chosen": chosen,
        "check": test["check"],
        "means": {"switched": {k: float(np.mean([r[k] for r in rows]))
                               for k in ("effective_usd", "cost_usd", "slo_attainment")},
                  "per_model_rule": {k: float(np.mean([r[k] for r in ref]))
                                     for k in ("effective_usd", "cost_usd", "slo_attainment")}},
        "switched_vs_per_model_rule": paired_ratio([r["effective_usd"] for r in rows],
                                                   [r["effective_usd"] for r in ref]),
        "room_seeds": n_room, "room_reproduces": bool(test["check"].get("reproduces", True)),
        "switched_vs_per_model_rule_room_seeds": paired_ratio([r["effective_usd"] for r in rows[:n_room]],
                                                              [r["effective_usd"] for r in ref[:n_room]]),
        "switched_vs_test_days_best_preset": {
            "preset": best_preset, **paired_ratio([r["effective_usd"] for r in rows[:n_room]],
                                                  [r[best_preset]["effective_usd"] for r in room_rows])},
        "lever_oracle_1h_vs_per_model_rule": paired_ratio(
            [r["lever_oracle/12"]["effective_usd"] for r in room_rows],
            [r["effective_usd"] for r in ref[:n_room]]),
        "time_limited_solves": int(sum(r["time_limited_solves"] for r in rows)),
        "seconds": round(time.perf_counter() - t0, 1), "loadavg": list(os.getloadavg())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", default="core/hedged/charged")
    ap.add_argument("--windows", default="12,48", help="steps since a preemption that turn the alert on")
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--validation-seeds", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--room-dir", type=Path, default=Path("benchmarks/runs/room"))
    ap.add_argument("--room-out", type=Path, default=Path("benchmarks/results/room.json"))
    ap.add_argument("--run-dir", type=Path, default=Path("benchmarks/runs/switched"))
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/switched.json"))
    args = ap.parse_args()
    doc: dict[str, Any] = json.loads(args.out.read_text()) if args.out.exists() else {}
    for key in args.cells.split(","):
        doc[key] = run_cell(key, args)
        atomic_write_text(args.out, json.dumps(doc, indent=1, default=float) + "\n")
    print(json.dumps(doc, indent=1, default=float))


if __name__ == "__main__":
    main()
