"""How fast the simulator world runs: the figures of the speed table, as one JSON document on
stdout (progress on stderr), written to benchmarks/results/speed.json.

Parts (``--parts``, comma-separated; default all):

- ``extended_day``: ``atoll simulate --scenario extended --days 11 --policy fixed:1
  --availability spot --capacity-error calibration`` in a fresh process, run twice: the first run
  fills whatever cache is missing, the second is the warm-cache figure (wall, peak RSS of the
  process, and the day's totals);
- ``core_2_days``: ``atoll simulate --scenario core --days 11-12 --policy fixed:1``, the same way;
- ``fleet20_day``: ``atoll simulate --scenario fleet20 --days 11 --policy fixed:1``, the same way;
- ``fleet20_contest_world_day``: the same day in the fleet20 contest cell's world (spot,
  calibration capacity error corrected online, latency SLO), the same way;
- ``env_steps``: re-optimizing env steps/s on extended (spot, calibration world, warm caches):
  the env's set-up seconds, then ``fixed:1`` over day 11 (every model re-solved every step);
- ``setup``: the extended day's set-up pieces in an empty cache folder (sampling the demand,
  the forecast pass) and again warm (loaded from the cache);
- ``help``: wall of ``atoll --help`` (best of 3 fresh interpreters);
- ``ppo``: PPO on extended with two SubprocVecEnv workers: env steps/s of ``learn`` after the
  workers are up (warm caches), and the steps that rate gives in 30 minutes;
- ``extended_charged_day``, ``fleet20_charged_day``: ``fixed:1@0.9`` on day 11, spot, in the
  charged world (``--world charged``), the same way;
- ``ppo_charged``: the ``ppo`` part in the charged world (``atoll/Fleet-v3``'s world);
- ``fleet20_library_cold``: ``atoll templates build --scenario fleet20 --workers 2`` in a fresh
  process and an empty cache folder (wall, peak RSS, templates, jobs run against jobs listed: a
  fine-tune shares its base's job);
- ``sliced_ilp``: the sliced ILP (extended's models, even mix, ample, vllm with slices) on the
  AWS-only fleet and the extended scenario, over slice kinds and with a column per placement:
  the seconds of each and whether the optima agree.

Figures this script does not take in bounded time are listed under ``not_measured`` with the
reason. Every part records ``os.getloadavg()`` before and after it: the machine has 2 cores and
other work may share them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# Run as a script, this file's folder leads sys.path and its name would shadow the package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

RESULTS = Path(__file__).resolve().parent / "results" / "speed.json"
ATOLL = str(Path(sys.executable).with_name("atoll"))
# the table's figures are for plans with a replica per phase (they were measured before pd auto was
# the default); `benchmarks/colocation.py --parts charged` measures what auto costs in the charged world
PD = ["--pd", "disaggregated"]
PARTS = ("extended_day", "core_2_days", "fleet20_day", "fleet20_contest_world_day", "env_steps", "setup",
         "help", "ppo", "sliced_ilp", "fleet20_library_cold", "extended_charged_day", "fleet20_charged_day",
         "ppo_charged")
EXTENDED_DAY = ["simulate", "--scenario", "extended", "--days", "11", "--policy", "fixed:1",
                "--availability", "spot", "--capacity-error", "calibration", *PD, "--json"]
CORE_2_DAYS = ["simulate", "--scenario", "core", "--days", "11-12", "--policy", "fixed:1", *PD, "--json"]
FLEET20_DAY = ["simulate", "--scenario", "fleet20", "--days", "11", "--policy", "fixed:1", *PD, "--json"]
# the world of the fleet20 contest cell (atoll/Fleet-v2): spot, capacities off by the calibration's
# spread, corrected online, latency SLO; its day is what a cell's grid, training and test cost
FLEET20_CONTEST_DAY = ["simulate", "--scenario", "fleet20", "--days", "11", "--policy", "fixed:1@0.9",
                       "--availability", "spot", "--capacity-error", "calibration", "--correction",
                       "--slo-model", "latency", *PD, "--json"]
# the charged world (atoll/Fleet-v3: sampled start-up, zone-correlated preemptions, spot acquisition
# that fails), where the risk contest and the room run
EXTENDED_CHARGED_DAY = ["simulate", "--scenario", "extended", "--days", "11", "--policy", "fixed:1@0.9",
                        "--availability", "spot", "--world", "charged", *PD, "--json"]
FLEET20_CHARGED_DAY = ["simulate", "--scenario", "fleet20", "--days", "11", "--policy", "fixed:1@0.9",
                       "--availability", "spot", "--world", "charged", *PD, "--json"]
NOT_MEASURED = {
    "one_fleet20_contest_cell": "grid + training + test days x 3 seeds is hours of 2-core compute",
    "ppo_steps_in_30_min_measured": "projected from the ppo part's measured rate instead of a 30-minute run",
    "fresh_make_test_and_demo": "timed from fresh clones with bash .ci/run and make demo "
                                "(docs/results/speed.md), not by this script",
    "1000_models_x_36_configs_re_solve": "the allocation solver's figure; not built here",
}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def load() -> list[float]:
    return [round(v, 2) for v in os.getloadavg()]


def run_process(argv: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    """Wall seconds, peak RSS (MB) and the parsed JSON stdout of one fresh process."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    doc: dict[str, Any] = {"wall_s": round(wall, 2), "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
                           "cpu_s": round(usage.ru_utime + usage.ru_stime, 2), "exit": proc.returncode}
    try:
        doc["result"] = json.loads(out)
    except ValueError:
        doc["result"] = None
    return doc


def simulate_twice(args: list[str]) -> dict[str, Any]:
    runs = []
    for label in ("first", "warm"):
        before = load()
        r = run_process([ATOLL, *args])
        totals = (r.pop("result") or {}).get("totals")
        runs.append({"run": label, **r, "totals": totals, "load_before": before, "load_after": load()})
        log(f"  {label}: {r['wall_s']} s, {r['peak_rss_mb']} MB")
    return {"command": "atoll " + " ".join(args), "runs": runs}


# the parts that time one ``atoll simulate`` command, first and warm
SIMULATED_DAYS = {"extended_day": EXTENDED_DAY, "core_2_days": CORE_2_DAYS, "fleet20_day": FLEET20_DAY,
                  "fleet20_contest_world_day": FLEET20_CONTEST_DAY,
                  "extended_charged_day": EXTENDED_CHARGED_DAY, "fleet20_charged_day": FLEET20_CHARGED_DAY}


def _sliced_problem(fleet: str) -> Any:
    """The sliced ILP of the issue's table: the extended scenario's six models, even mix, ample
    availability, cost mode, vllm with slices, on the AWS-only fleet or the whole scenario (the
    fleets of benchmarks/slices.py)."""
    import importlib.util

    from atoll.solvers.scenarios import build_problem

    if fleet == "extended":
        return build_problem("extended", "ample", "even", runtime="vllm", slices=True)
    spec_ = importlib.util.spec_from_file_location("slices_bench", Path(__file__).with_name("slices.py"))
    assert spec_ is not None and spec_.loader is not None
    bench = importlib.util.module_from_spec(spec_)
    here = str(Path(__file__).resolve().parent)
    sys.path.insert(0, here)  # slices.py imports its sibling emit.py
    try:
        spec_.loader.exec_module(bench)
    finally:
        sys.path.remove(here)
    from atoll.solvers.catalog import load_catalog
    from atoll.solvers.problem import AllocationProblem
    from atoll.solvers.scenarios import SCENARIOS, library_spec, scenario_demand
    from atoll.solvers.templates import build_library

    catalog = load_catalog()
    offers = bench.fleets(catalog)["aws"]
    cat = dataclasses.replace(catalog, offers=offers)
    regions = tuple(sorted({o.region for o in offers}))
    gpus = tuple(sorted({cat.config(o.config).gpu.name for o in offers}))
    spec = dataclasses.replace(library_spec(SCENARIOS["extended"], "vllm"), regions=regions, gpu_types=gpus,
                               slices=True)
    lib = build_library(spec, catalog=cat, workers=1, progress=False)
    prices = {(o.region, o.config): o.on_demand_per_hour for o in offers}
    return AllocationProblem(lib.templates, scenario_demand(SCENARIOS["extended"], "even"), None, prices)


def part_sliced_ilp() -> dict[str, Any]:
    """The sliced ILP over slice kinds, and (``every_placement``) the same ILP with a column per
    placement: the same optimum, and the seconds of each."""
    from atoll.solvers.allocation import evaluate_plan, kinds, solve_allocation

    out: dict[str, Any] = {}
    for fleet in ("aws_extended", "extended"):
        problem = _sliced_problem("extended" if fleet == "extended" else "aws")
        row: dict[str, Any] = {"templates": len(problem.templates)}
        for label in ("kinds", "every_placement"):
            supports = kinds.supports
            if label == "every_placement":
                kinds.supports = lambda inst: False  # type: ignore[assignment]
            try:
                before = load()
                t0 = time.perf_counter()
                res = solve_allocation(problem)
                wall = time.perf_counter() - t0
            finally:
                kinds.supports = supports  # type: ignore[assignment]
            ev = evaluate_plan(problem, res.allocation) if res.allocation is not None else None
            row[label] = {"status": res.status.value, "cost_per_hour": round(res.cost_per_hour, 4),
                          "gap": res.gap, "wall_s": round(wall, 2), "solve_s": round(res.solve_seconds, 2),
                          "evaluator_feasible": None if ev is None else ev.feasible,
                          "load_before": before, "load_after": load()}
            log(f"sliced {fleet} {label}: {row[label]}")
        a, b = row["kinds"]["cost_per_hour"], row["every_placement"]["cost_per_hour"]
        row["same_optimum"] = abs(a - b) <= 1e-4 * b
        out[fleet] = row
    return out


def extended_config() -> Any:
    from atoll.envs.config import FleetConfig

    return FleetConfig(scenario="extended", days=(11, 11), availability="spot", capacity_error="calibration",
                       pd="disaggregated")


def part_env_steps() -> dict[str, Any]:
    from atoll.envs.fleet_env import FleetEnv
    from atoll.envs.policies import make_policy
    from atoll.envs.rollout import run_policy
    from atoll.envs.vocabulary import parse_policy

    before = load()
    t0, c0 = time.perf_counter(), time.process_time()
    env = FleetEnv(extended_config())
    setup, setup_cpu = time.perf_counter() - t0, time.process_time() - c0
    t0, c0 = time.perf_counter(), time.process_time()
    ep = run_policy(env, make_policy(parse_policy("fixed:1"), len(env.models)), days=[11], seed=0)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    # CPU seconds beside the wall: on a shared machine the wall is an upper bound
    return {"env_setup_s": round(setup, 2), "env_setup_cpu_s": round(setup_cpu, 2),
            "episode_s": round(seconds, 2), "episode_cpu_s": round(cpu, 2), "steps": len(ep.steps),
            "steps_per_s": round(len(ep.steps) / seconds, 2),
            "steps_per_cpu_s": round(len(ep.steps) / cpu, 2), "totals": ep.totals(),
            "load_before": before, "load_after": load()}


def part_setup() -> dict[str, Any]:
    import numpy as np

    from atoll.envs import demand
    from atoll.envs.actions import ActionCodec
    from atoll.envs.config import FleetConfig
    from atoll.solvers.scenarios import SCENARIOS

    spec = SCENARIOS["extended"]
    c = FleetConfig(scenario="extended", pd="disaggregated")
    levels = ActionCodec.for_config(c.planning_quantile, c.action_levels).levels
    out: dict[str, Any] = {"load_before": load()}
    old = os.environ.get("ATOLL_CACHE_DIR")
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["ATOLL_CACHE_DIR"] = tmp
        try:
            for label in ("cold", "warm"):
                demand._named_series.cache_clear()
                t0, c0 = time.perf_counter(), time.process_time()
                series = demand.workload_series("servegen", spec.models, spec.req_per_s, c.step_s,
                                                resample="sampled", seed=0)
                sampled, sampled_cpu = time.perf_counter() - t0, time.process_time() - c0
                t0, c0 = time.perf_counter(), time.process_time()
                demand.build_book(spec.models, series, forecaster=c.forecaster, horizon=c.look_ahead_steps,
                                  quantile=c.planning_quantile, levels=levels)
                passed, passed_cpu = time.perf_counter() - t0, time.process_time() - c0
                out[label] = {"demand_s": round(sampled, 2), "demand_cpu_s": round(sampled_cpu, 2),
                              "forecast_pass_s": round(passed, 2),
                              "forecast_pass_cpu_s": round(passed_cpu, 2)}
                log(f"  {label}: {out[label]}")
            out["mean_req_per_s"] = [round(float(np.mean(s.requests_per_s)), 3) for s in series]
        finally:
            if old is None:
                os.environ.pop("ATOLL_CACHE_DIR", None)
            else:
                os.environ["ATOLL_CACHE_DIR"] = old
    out["load_after"] = load()
    return out


def part_fleet20_library_cold() -> dict[str, Any]:
    from atoll.solvers.scenarios import SCENARIOS, library_spec

    jobs = library_spec(SCENARIOS["fleet20"]).jobs()
    before = load()
    with tempfile.TemporaryDirectory() as tmp:
        r = run_process([ATOLL, "templates", "build", "--scenario", "fleet20", "--workers", "2", *PD,
                         "--json"],
                        env={**os.environ, "ATOLL_CACHE_DIR": tmp})
        entries = len(list(Path(tmp).glob("*.json")))
    doc = r.pop("result") or {}
    log(f"  cold: {r['wall_s']} s, {r['peak_rss_mb']} MB")
    return {**r, "templates": doc.get("total_templates"), "build_s": doc.get("build_seconds"),
            "jobs": len(jobs), "jobs_run": len({j.entry_key for j in jobs}), "cache_entries": entries,
            "load_before": before, "load_after": load()}


def part_help() -> dict[str, Any]:
    before = load()
    walls = [run_process([ATOLL, "--help"])["wall_s"] for _ in range(3)]
    return {"best_s": min(walls), "runs_s": walls, "load_before": before, "load_after": load()}


def part_ppo(timesteps: int, charged: bool = False) -> dict[str, Any]:
    import torch
    from stable_baselines3 import PPO

    from atoll.training.train import TrainSettings, make_vec_env

    torch.set_num_threads(1)
    st = TrainSettings()
    before = load()
    t0 = time.perf_counter()
    from atoll.envs import WORLDS

    config = dataclasses.replace(extended_config(), days=(4, 7), **(WORLDS["charged"] if charged else {}))
    vec = make_vec_env(config, st.n_envs, 0, st.gamma)
    setup = time.perf_counter() - t0
    try:
        n_steps = max(timesteps // st.n_envs, 8)
        model = PPO("MlpPolicy", vec, n_steps=n_steps, batch_size=min(st.batch_size, n_steps * st.n_envs),
                    n_epochs=st.n_epochs, device="cpu", seed=0, verbose=0)
        t0 = time.perf_counter()
        model.learn(total_timesteps=n_steps * st.n_envs)
        seconds = time.perf_counter() - t0
    finally:
        vec.close()
    steps = n_steps * st.n_envs
    world = "charged" if charged else "calibration capacities"
    return {"world": world, "n_envs": st.n_envs, "vec_env_setup_s": round(setup, 2), "steps": steps,
            "learn_s": round(seconds, 2), "steps_per_s": round(steps / seconds, 2),
            "projected_steps_in_30_min": int(steps / seconds * 1800), "load_before": before,
            "load_after": load()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    ap.add_argument("--ppo-steps", type=int, default=256, help="PPO env steps timed in the ppo part")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    parts = [p for p in args.parts.split(",") if p]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        ap.error(f"unknown part(s) {', '.join(unknown)}; valid: {', '.join(PARTS)}")
    doc: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "load_at_start": load()}, "parts": {}}
    try:
        doc["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                       text=True, cwd=Path(__file__).parent, check=False).stdout.strip()
    except OSError:
        doc["commit"] = None
    for part in parts:
        log(f"{part} ...")
        t0 = time.perf_counter()
        if part in SIMULATED_DAYS:
            doc["parts"][part] = simulate_twice(SIMULATED_DAYS[part])
        elif part in ("ppo", "ppo_charged"):
            doc["parts"][part] = part_ppo(args.ppo_steps, charged=part == "ppo_charged")
        else:
            doc["parts"][part] = globals()[f"part_{part}"]()
        doc["parts"][part]["part_wall_s"] = round(time.perf_counter() - t0, 2)
    doc["not_measured"] = NOT_MEASURED
    doc["machine"]["load_at_end"] = load()
    text = json.dumps(doc, indent=1, default=float)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
