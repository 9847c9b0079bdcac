"""The room before training, per contest cell, as one JSON document on stdout (progress on stderr).

Per cell (scenario / market / world [/ demand half]):

1. the rule grid (``fixed:K@q[+RISK]``) on the validation days (cached:
   :func:`atoll.training.contest.cached_validation_grid`); the **best uniform rule** (least
   effective cost there) and the **per-model rule** (:func:`atoll.training.contest.per_model_best`)
   are chosen there, nothing else is;
2. on the test days, for every seed (the same demand, availability and preemption draws for every
   policy of that seed): each *preset* — the grid's ``fixed:1`` rules, every level and risk — run
   uniformly with each step's effective cost per model recorded; the best rule, the per-model rule
   and the demand oracles (``oracle-rate`` and ``oracle-quantile`` taking the best rule's risk);
3. the **time-of-day rule**, a state-dependent rule: per model and hour of the day, the preset of
   least cost summed over the validation days (``--time-of-day-seeds`` seeds of their own), run on
   the test days as a policy switched by the clock; then the **lever oracle** per block size
   (``--blocks``, steps; 12 = 1 h, 48 = 4 h): per seed, model and block the preset of least cost
   in hindsight (:func:`atoll.training.lever_oracle.compose`), its estimate, and the same choice
   **run as a real policy** (:class:`atoll.training.lever_oracle.ScheduledRule`);
4. ratios of effective cost (node $ + lost tokens at ``--lost-usd-per-mtok``), paired per seed, with
   95% t intervals (:func:`atoll.training.lever_oracle.paired_ratio`): **room** = the run lever
   oracle / the per-model rule (what any policy with these levers could gain), the demand room =
   oracle-rate / the per-model rule, and the per-model rule / the best rule; each also over the
   seeds where no run of that seed hit a solver time limit (``without_time_limited``).

What is not paired: each policy's first plan is made at its own configured risk (a rule's, or the
schedule's most used preset), as in the contest. Results merge into ``--out`` (one key per cell).
With ``--run-dir`` every finished seed is kept as a file, and a stopped run resumes from them.

    .venv/bin/python benchmarks/room.py --cells core/spot/charged --seeds 8 --out benchmarks/results/room.json
    .venv/bin/python benchmarks/room.py --cells core/hedged/charged --workers 1 \
        --run-dir benchmarks/runs/room --out benchmarks/results/room.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pickle
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from functools import partial
from pathlib import Path
from typing import Any

# Run as a script, this file's folder leads sys.path and its name would shadow the package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import numpy as np  # noqa: E402

from atoll.envs import WORLDS  # noqa: E402
from atoll.envs.config import FleetConfig  # noqa: E402
from atoll.envs.fleet_env import FleetEnv  # noqa: E402
from atoll.envs.vocabulary import parse_policy  # noqa: E402
from atoll.solvers.allocation.direct import SOLVER_VERSION  # noqa: E402
from atoll.solvers.files import atomic_write_bytes, atomic_write_text  # noqa: E402
from atoll.training.contest import (  # noqa: E402
    ContestSettings,
    cached_validation_grid,
    per_model_best,
    validation_choices,  # noqa: E402
)
from atoll.training.evaluate import resolve_policy  # noqa: E402
from atoll.training.lever_oracle import (  # noqa: E402
    ScheduledRule,
    clock_schedule,
    compose,
    measured,
    paired_ratio,
    preset_of,
)

DEMAND_ORACLES = ("oracle-rate", "oracle-quantile")


def _run(env: FleetEnv, spec_or_policy: Any, days: list[int], seed: int, lost: float
         ) -> tuple[np.ndarray, dict[str, float]]:
    policy = spec_or_policy if not isinstance(spec_or_policy, str) \
        else resolve_policy(parse_policy(spec_or_policy), len(env.models))
    return measured(env, policy, days=days, seed=seed, lost_usd_per_mtok=lost)


def preset_costs(config: FleetConfig, presets: list[str], days: list[int], seed: int, lost: float
                 ) -> np.ndarray:
    """Each preset run uniformly over ``days``: step costs per model, ``(presets, steps, models)``."""
    env = FleetEnv(config)
    return np.stack([_run(env, spec, days, seed, lost)[0] for spec in presets])


def _kept(parts: Path | None, name: str, run: Callable[[], tuple[np.ndarray, dict[str, float]]]
          ) -> tuple[np.ndarray, dict[str, float]]:
    """``run()``, or what an earlier sitting stored of it in ``parts`` (one file per run: a seed of
    a charged extended cell is 9 runs and hours, longer than a sitting may last)."""
    path = parts / (name.replace("/", "_").replace(":", "_").replace("@", "_").replace(",", "_") + ".json") \
        if parts is not None else None
    if path is not None and path.exists():
        doc = json.loads(path.read_text())
        return np.asarray(doc["costs"], dtype=float), doc["totals"]
    costs, totals = run()
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps({"name": name, "costs": np.asarray(costs).tolist(),
                                            "totals": totals}, default=str) + "\n")
    return costs, totals


def seed_job(config: FleetConfig, presets: list[str], refs: dict[str, str], blocks: list[int],
             days: list[int], seed: int, lost: float, clock: np.ndarray | None = None,
             clock_block: int = 12, parts: Path | None = None) -> dict[str, Any]:
    """Everything of one seed: the presets (with their step costs), the references, the oracles,
    and the time-of-day rule (``clock``: its schedule for one day, chosen on validation days).
    ``parts``: a folder keeping each finished run, so a stopped seed resumes run by run."""
    env = FleetEnv(config)
    out: dict[str, Any] = {}
    costs = []
    for spec in presets:
        c, totals = _kept(parts, spec, partial(_run, env, spec, days, seed, lost))
        costs.append(c)
        out[spec] = totals
    for name, spec in refs.items():
        out[name] = out[spec] if spec in out else \
            _kept(parts, spec, partial(_run, env, spec, days, seed, lost))[1]
    stacked = np.stack(costs)
    options = tuple(preset_of(parse_policy(s)) for s in presets)
    for b in blocks:
        schedule, estimate = compose(stacked, b)
        oracle = ScheduledRule(options, schedule, b, tuple(days), config.episode_steps,
                               name=f"lever-oracle/{b}")
        _, totals = _kept(parts, f"lever_oracle/{b}", partial(_run, env, oracle, days, seed, lost))
        share = np.bincount(schedule.ravel(), minlength=len(presets)).tolist()
        out[f"lever_oracle/{b}"] = {**totals, "estimate_usd": estimate, "preset_share": share}
    if clock is not None:
        rule = ScheduledRule(options, np.tile(clock, (len(days), 1)), clock_block, tuple(days),
                             config.episode_steps, name="time-of-day")
        out["time_of_day"] = _kept(parts, "time_of_day", partial(_run, env, rule, days, seed, lost))[1]
    return out


def _ratio(rows: list[dict[str, Any]], num: str, den: str) -> dict[str, Any]:
    clean = [r for r in rows
             if not any(v.get("time_limited_solves", 0) for v in r.values() if isinstance(v, dict))]
    both = paired_ratio([r[num]["effective_usd"] for r in rows], [r[den]["effective_usd"] for r in rows])
    both["without_time_limited"] = (paired_ratio([r[num]["effective_usd"] for r in clean],
                                                 [r[den]["effective_usd"] for r in clean]) if clean else None)
    return both


def ratios_of(rows: list[dict[str, Any]], presets: list[str], blocks: list[int]) -> dict[str, Any]:
    """The cell's paired ratios from its per-seed rows. Besides the room against the per-model rule
    (chosen on validation days), the room against the **test days' best uniform preset**, chosen in
    hindsight (least mean effective cost over the seeds): it separates what a within-day choice of
    lever could gain from what choosing the rule on unrepresentative validation days cost."""
    oracles = [f"lever_oracle/{b}" for b in blocks]
    hindsight = min(presets, key=lambda name: float(np.mean([r[name]["effective_usd"] for r in rows])))
    ratios: dict[str, Any] = {
        "room": {o: _ratio(rows, o, "per_model_rule") for o in oracles},
        "demand_room": {d: _ratio(rows, d, "per_model_rule") for d in DEMAND_ORACLES},
        "per_model_rule_vs_best_rule": _ratio(rows, "per_model_rule", "best_rule"),
        "lever_oracle_vs_best_rule": {o: _ratio(rows, o, "best_rule") for o in oracles},
        "test_best_preset": hindsight,
        "lever_oracle_vs_test_best_preset": {o: _ratio(rows, o, hindsight) for o in oracles},
        "per_model_rule_vs_test_best_preset": _ratio(rows, "per_model_rule", hindsight)}
    if all("time_of_day" in r for r in rows):
        ratios["time_of_day_vs_per_model_rule"] = _ratio(rows, "time_of_day", "per_model_rule")
    return ratios


def recompute(path: Path) -> dict[str, Any]:
    """``--recompute``: every cell's ratios again from its stored per-seed rows (no run)."""
    doc = json.loads(path.read_text())
    for c in doc.values():
        blocks = [int(k.split("/")[1]) for k in c["composed_estimate_vs_per_model_rule"]]
        c["ratios"] = ratios_of(c["per_seed"], c["presets"], blocks)
    atomic_write_text(path, json.dumps(doc, indent=1) + "\n")
    return doc



def same_solver(folder: Path, key: str) -> None:
    """A cell's seeds are paired only if one solver made them all: the run folder records the
    solver version (``solver.json``) and a checkout of another version refuses to resume it."""
    record = folder / "solver.json"
    if record.exists():
        had = json.loads(record.read_text()).get("solver_version")
        if had != SOLVER_VERSION:
            raise SystemExit(f"room: run folder {str(folder)!r} ({key}) was measured with solver version "
                             f"{had}, this checkout's is {SOLVER_VERSION}; resume it from a checkout of "
                             f"version {had} (git worktree add <dir> <commit>), or pass another --run-dir "
                             f"to measure the cell again")
    else:
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_text(record, json.dumps({"solver_version": SOLVER_VERSION}) + "\n")

def cell(args: argparse.Namespace, key: str, log: Any) -> dict[str, Any]:
    parts = key.split("/")
    scenario, availability, world = parts[:3]
    workload = f"servegen-{parts[3]}" if len(parts) > 3 else "servegen"
    # a replica per phase, as every stored cell was measured (before pd auto was the default), so a
    # cell's seeds stay paired across sittings
    config = FleetConfig(scenario=scenario, availability=availability, workload=workload, pd="disaggregated",
                         action_levels=tuple(float(q) for q in args.levels.split(",")), **WORLDS[world])
    risks = tuple(r.strip() for r in args.risks.split(";") if r.strip())
    st = ContestSettings(validation_days=_days(args.validation_days), test_days=_days(args.test_days),
                         seeds=args.seeds, validation_seeds=1, levels=config.action_levels,
                         intervals=tuple(int(k) for k in args.intervals.split(",")), bands=(),
                         workers=args.workers, risks=risks, per_model_targets=0, hindsight=False)
    t0 = time.perf_counter()
    folder = args.run_dir / key.replace("/", "-") if args.run_dir else None
    if folder is not None:
        same_solver(folder, key)
    if folder is not None and (folder / "validation.pkl").exists():
        # the run folder is in git, the cache is not: a new machine resumes from the folder
        validation, grid_s = pickle.loads((folder / "validation.pkl").read_bytes())
        log(f"{key}: validation grid read from {folder}")
    else:
        validation, grid_s, cached = cached_validation_grid(config, st, note=lambda t: log(f"{key}: {t}"))
        if folder is not None:
            folder.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(folder / "validation.pkl", cached.read_bytes())
    lost = st.lost_price(config)
    n = len(FleetEnv(config).models)
    _, best, _ = validation_choices(validation, n, st, lost)
    per_model = per_model_best(config, validation, n, st)
    presets = [s for s in st.grid if s.startswith("fixed:1@")]
    best_risk = best.partition("+")[2]
    suffix = f"+{best_risk}" if best_risk else ""
    refs = {"best_rule": best, "per_model_rule": per_model, "oracle-rate": f"oracle-rate{suffix}",
            "oracle-quantile": f"oracle-quantile{suffix}"}
    log(f"{key}: best rule {best}, per-model rule {per_model}, presets {presets}")
    tdays = list(range(st.test_days[0], st.test_days[1] + 1))
    blocks = [int(b) for b in args.blocks.split(",")]
    first, last = min(st.validation_days[0], st.test_days[0]), max(st.validation_days[1], st.test_days[1])
    config = dataclasses.replace(config, days=(first, last))
    FleetEnv(config)  # the demand and forecast caches, once, before the workers read them
    rows: list[dict[str, Any]] = [{} for _ in range(args.seeds)]
    clock = None
    vdays = list(range(st.validation_days[0], st.validation_days[1] + 1))
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        if args.time_of_day_seeds:
            clock_file = folder / "clock.json" if folder is not None else None
            if clock_file is not None and clock_file.exists():
                clock = np.asarray(json.loads(clock_file.read_text()), dtype=int)
            else:
                # the time-of-day rule is chosen on the validation days' costs, never on the test days'
                val = [pool.submit(preset_costs, config, presets, vdays, 100 + k, lost)
                       for k in range(args.time_of_day_seeds)]
                clock = clock_schedule(sum(f.result() for f in val), len(vdays), 12)
                if clock_file is not None:
                    atomic_write_text(clock_file, json.dumps(clock.tolist()) + "\n")
            log(f"{key}: time-of-day rule chosen on days {vdays[0]}-{vdays[-1]} "
                f"({args.time_of_day_seeds} seeds): preset shares {np.bincount(clock.ravel()).tolist()}")
        done = {k: folder / f"seed-{k}.json" for k in range(args.seeds)} if folder is not None else {}
        for k, path in done.items():
            if path.exists():
                rows[k] = json.loads(path.read_text())
                log(f"{key}: seed {k} read from {path}")
        futures = {pool.submit(seed_job, config, presets, refs, blocks, tdays, k, lost, clock,
                               parts=folder / f"seed-{k}-runs" if folder is not None else None): k
                   for k in range(args.seeds) if not rows[k]}
        for future in as_completed(futures):
            k = futures[future]
            rows[k] = future.result()
            if folder is not None:
                atomic_write_text(done[k], json.dumps(rows[k], default=str) + "\n")
            log(f"{key}: seed {k} done ({time.perf_counter() - t0:.0f} s)")
    ratios = ratios_of(rows, presets, blocks)
    estimate = {f"lever_oracle/{b}": paired_ratio([r[f"lever_oracle/{b}"]["estimate_usd"] for r in rows],
                                                  [r["per_model_rule"]["effective_usd"] for r in rows])
                for b in blocks}
    names = [*presets, *refs, *(f"lever_oracle/{b}" for b in blocks)]
    names += ["time_of_day"] if clock is not None else []
    means = {name: {k: float(np.mean([r[name][k] for r in rows]))
                    for k in ("effective_usd", "cost_usd", "slo_attainment", "time_limited_solves")}
             for name in names}
    return {"settings": {**vars(args), "cell": key}, "best_rule": best, "per_model_rule": per_model,
            "presets": presets, "lost_usd_per_mtok": lost, "test_days": tdays, "seeds": args.seeds,
            "grid_seconds": grid_s, "seconds": time.perf_counter() - t0, "loadavg": list(os.getloadavg()),
            "ratios": ratios, "composed_estimate_vs_per_model_rule": estimate, "means": means,
            "time_of_day_schedule": clock.tolist() if clock is not None else None,
            "per_seed": rows}


def _days(text: str) -> tuple[int, int]:
    a, _, b = text.partition("-")
    return int(a), int(b or a)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", default="core/spot/charged",
                        help="comma-separated scenario/market/world[/steady|bursty]")
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--levels", default="0.9")
    parser.add_argument("--intervals", default="1,3")
    parser.add_argument("--risks", default="neutral;h0.85;h0.7")
    parser.add_argument("--blocks", default="12,48", help="lever-oracle block sizes in steps (12: 1 h)")
    parser.add_argument("--validation-days", default="8-10")
    parser.add_argument("--test-days", default="11-14")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--time-of-day-seeds", type=int, default=2,
                        help="validation seeds (100, 101, ...) the time-of-day rule is chosen on (0: none)")
    parser.add_argument("--out", type=Path, default=None, help="merge each cell into this JSON document")
    parser.add_argument("--run-dir", type=Path, default=None, metavar="DIR",
                        help="keep each cell's validation grid, time-of-day rule and finished seeds here "
                             "(commit it: a run resumes from it on any machine)")
    parser.add_argument("--recompute", type=Path, default=None, metavar="FILE",
                        help="recompute the ratios of every cell of FILE from its per-seed rows, run nothing")
    args = parser.parse_args()
    if args.recompute:
        print(json.dumps({k: c["ratios"] for k, c in recompute(args.recompute).items()}, indent=1))
        return

    def log(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    out: dict[str, Any] = {}
    for key in args.cells.split(","):
        out[key] = cell(args, key, log)
        log(json.dumps({key: out[key]["ratios"]["room"]}))
        if args.out:
            doc = json.loads(args.out.read_text()) if args.out.exists() else {}
            doc[key] = out[key]
            atomic_write_text(args.out, json.dumps(doc, indent=1, default=str) + "\n")
    print(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
