"""The risk a re-plan takes, as a rule's lever: one rule (``fixed:1``) under risk variants
(headroom, spread over spot pools, on-demand floor), chosen on validation days and reported on
test days. Prints ONE JSON document (progress on stderr).

The world is the contest's: the calibration world (``capacity_error="calibration"``), the
latency SLO model (late requests count as missed), spot and hedged markets; ``--world charged``
is the world that charges what a cluster charges (``atoll.envs.CHARGED``: sampled start-up,
zone-correlated preemptions, spot acquisition that fails). Selection, per market, on the
validation days only: the variant of least effective cost (node $ + lost tokens at the
reward's $/M, a lost token being one not served within the SLO) among those whose SLO
attainment is at least the neutral plan's minus 0.001. Every variant is reported on the test
days, the chosen one marked; nothing on the test days chooses anything. Each run also says where
its misses went (:class:`atoll.envs.slo_loss.MissCounter`: after a preemption, capacity,
latency). ``--hindsight``: hindsight (re-plan every model every step on the true demand) with
the neutral and the chosen variant on the test days: what knowing the demand adds to that
lever. ``--oracle-rate``: the same re-plans for the trace's own underlying rate (the rate the
requests are drawn from, not their sampled counts) with the chosen variant: what a perfect rate
forecast adds. Both are references, not bounds: a rule planning for a forecast's quantile keeps
a margin these plans for a mean do not, and can beat them. ``--oracle-quantile``: the rule's own
level with each variant, planned for each step's quantile of the demand sampled anew from the
true rate (:func:`atoll.envs.demand.sampled_quantiles`): the rule's margin on a perfect forecast
of the rate and its noise. Against the rule with the chosen variant it reports oracle-quantile
with that variant and the best of the variants on the test days (``oracle_quantile_best``: the
bound with the same levers; a bound may read the test days, a choice may not).

Each finished run is kept in the cache (``risk/`` under ``$ATOLL_CACHE_DIR`` or the user's
cache folder), keyed by its job, world and solver version, and read back by a later invocation
(``"cached": true``), so a stopped benchmark loses only the runs under way. ``--fresh`` runs
everything anew, as it must after a change to the simulator (the key does not see the code). A
run whose re-plans stopped at the solver's time limit (``time_limited_solves``) is kept as this
machine found it.

    .venv/bin/python benchmarks/risk.py [--scenario core] [--markets spot,hedged]
        [--world calibration|charged] [--rule fixed:1@0.9] [--validation-days 8-10]
        [--test-days 11-14] [--variants "neutral;h0.85;..."] [--hindsight] [--oracle-rate]
        [--oracle-quantile] [--workers 2]
        [--workload servegen|servegen-steady|servegen-bursty] [--fresh] [--out FILE]
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from emit import emit  # this folder's own module, imported while the folder is on sys.path

# Run as a script, this file's folder leads sys.path and its name would shadow the package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

from atoll.envs import CHARGED  # noqa: E402
from atoll.envs.config import FleetConfig  # noqa: E402
from atoll.envs.fleet_env import FleetEnv  # noqa: E402
from atoll.envs.policies import make_policy  # noqa: E402
from atoll.envs.rollout import run_policy  # noqa: E402
from atoll.envs.slo_loss import BUCKETS, MissCounter  # noqa: E402
from atoll.envs.vocabulary import parse_policy  # noqa: E402
from atoll.forecast.workloads import SERVEGEN_WORKLOADS  # noqa: E402
from atoll.solvers.allocation.direct import SOLVER_VERSION  # noqa: E402
from atoll.solvers.errors import AtollError  # noqa: E402
from atoll.solvers.files import atomic_write_text  # noqa: E402
from atoll.solvers.paths import cache_root  # noqa: E402
from atoll.solvers.problem import Risk  # noqa: E402

WORLDS: dict[str, dict[str, Any]] = {
    "calibration": {"capacity_error": "calibration", "slo_model": "latency"},
    "charged": {k: v for k, v in CHARGED.items() if k != "observation"},
}

VARIANTS = ("neutral", "h0.85", "h0.7", "s0.5", "f0.3", "h0.85,s0.5", "h0.85,f0.3")
# time_limited_solves: re-plans stopped at the solver's time limit — a run with any depends on the
# machine's speed, not only on its seed
KEYS = ("cost_usd", "slo_attainment", "goodput_share", "preemptions", "ondemand_node_hour_share",
        "reoptimizations", "churn_per_hour", "time_limited_solves")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _days(text: str) -> list[int]:
    a, _, b = text.partition("-")
    return list(range(int(a), int(b or a) + 1))


Job = tuple[str, str, str, str, str, list[int], int, str]


def _cached(job: Job) -> Path:
    """Where a finished run of ``job`` is kept: ``risk/<digest>.json`` under the cache root, the
    digest of the job, its world's settings and the solver version (a fleet20 run takes hours, and
    a stopped benchmark then loses only the runs under way)."""
    key = json.dumps([list(job[:5]), job[5], job[6], job[7], WORLDS[job[2]], SOLVER_VERSION], default=str)
    return cache_root() / "risk" / f"{hashlib.sha256(key.encode()).hexdigest()[:24]}.json"


def _run(job: Job, fresh: bool = False) -> dict[str, Any]:
    """One (scenario, market, world, rule, risk) run over ``days`` on ``workload``: totals,
    effective cost, misses; read back when a finished run of the same job is in the cache
    (``cached``: true; its ``wall_s`` and ``load`` are the original run's) unless ``fresh``."""
    path = _cached(job)
    if not fresh and path.exists():
        return {**json.loads(path.read_text()), "cached": True}
    scenario, market, world, rule, risk, days, seed, workload = job
    t0 = time.perf_counter()
    level = parse_policy(rule).level  # the rule's own planning level (@q), the env's
    config = FleetConfig(scenario=scenario, days=(min(days), max(days)), availability=market,
                         risk=Risk.parse(risk), workload=workload, **WORLDS[world],
                         **({"planning_quantile": level} if level is not None else {}))
    env = FleetEnv(config)
    misses = MissCounter(env.models)
    chosen = make_policy(parse_policy(rule), len(env.models))
    ep = run_policy(env, chosen, days=days, seed=seed, on_step=misses.add)
    totals = ep.totals()
    out = {k: round(float(totals.get(k, 0.0)), 6) for k in KEYS}
    fleet = misses.result()["fleet"]
    out["misses"] = {b: round(fleet[f"{b}_share"], 4) for b in BUCKETS}
    lost = max(totals["demand_tokens"] - totals["goodput_tokens"], 0.0)  # not served within the SLO
    out["lost_mtok"] = round(lost / 1e6, 4)
    price = config.reward.unserved_usd_per_mtok
    out["effective_cost_usd"] = round(totals["cost_usd"] + price * lost / 1e6, 4)
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    out["load"] = round(os.getloadavg()[0], 2)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(out))  # whole or absent, even if killed mid-write
    return out


def _run_all(jobs: list[Job], workers: int, fresh: bool) -> list[dict[str, Any]]:
    """The runs of ``jobs`` in order, ``workers`` at a time (each a whole simulation: same
    figures whatever the number of workers)."""
    for job in jobs:
        log(f"{job[1]} days {job[5][0]}-{job[5][-1]}: {job[3]} + {job[4]} ...")
    if workers <= 1:
        outs = [_run(job, fresh) for job in jobs]
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            outs = list(pool.map(functools.partial(_run, fresh=fresh), jobs))
    for job, out in zip(jobs, outs, strict=True):
        log(f"  {job[1]} {job[3]} + {job[4]} days {job[5][0]}-{job[5][-1]}: ${out['cost_usd']:,.1f}, "
            f"SLO {out['slo_attainment']:.4f}, effective ${out['effective_cost_usd']:,.1f}, "
            f"misses {out['misses']} ({out['wall_s']} s{', cached' if out.get('cached') else ''})")
    return outs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="core")
    ap.add_argument("--markets", default="spot,hedged")
    ap.add_argument("--world", default="calibration", choices=sorted(WORLDS))
    ap.add_argument("--rule", default="fixed:1", help="the rule every variant runs (e.g. fixed:1@0.9)")
    ap.add_argument("--validation-days", default="8-10")
    ap.add_argument("--test-days", default="11-14")
    ap.add_argument("--variants", default=";".join(VARIANTS),
                    help="risk labels separated by ';' (each e.g. h0.85,s0.5,f0.3)")
    ap.add_argument("--hindsight", action="store_true",
                    help="also run hindsight with the neutral and the chosen variant on the test days")
    ap.add_argument("--oracle-rate", action="store_true",
                    help="also run oracle-rate (plans for the trace's true rate) with the chosen variant "
                         "on the test days")
    ap.add_argument("--oracle-quantile", action="store_true",
                    help="also run oracle-quantile at the rule's level (plans for the quantile of the demand "
                         "sampled anew from the true rate) with the chosen variant on the test days")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workload", default="servegen", choices=sorted(SERVEGEN_WORKLOADS),
                    help="the scenario's demand: every ServeGen client, or its steady or bursty half")
    ap.add_argument("--workers", type=int, default=1, help="runs at a time (processes)")
    ap.add_argument("--fresh", action="store_true",
                    help="run every job anew, ignoring (and replacing) the finished runs in the cache")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    variants = [v for v in args.variants.split(";") if v]
    if "neutral" not in variants:
        ap.error(f"--variants must include 'neutral' (the selection's SLO reference), got {args.variants!r}")
    try:  # a bad rule or variant fails here, naming itself, before any run
        make_policy(parse_policy(args.rule), 1)
        for v in variants:
            Risk.parse(v)
    except (AtollError, ValueError) as exc:  # Risk's own checks raise ValueError
        ap.error(str(exc))
    val, test = _days(args.validation_days), _days(args.test_days)
    doc: dict[str, Any] = {"scenario": args.scenario, "workload": args.workload, "rule": args.rule,
                           "world": args.world,
                           "world_settings": WORLDS[args.world], "slo_model": "latency",
                           "validation_days": val, "test_days": test, "seed": args.seed,
                           "workers": args.workers,
                           "load_before": [round(x, 2) for x in os.getloadavg()], "markets": {}}
    t0 = time.perf_counter()
    for market in args.markets.split(","):
        # an on-demand floor needs on-demand capacity to stand on
        names = [v for v in variants if market == "hedged" or Risk.parse(v).ondemand_floor == 0]
        cell: dict[str, Any] = {"validation": {}, "test": {}}
        outs = _run_all([(args.scenario, market, args.world, args.rule, v, val, args.seed, args.workload)
                         for v in names], args.workers, args.fresh)
        cell["validation"] = dict(zip(names, outs, strict=True))
        base = cell["validation"]["neutral"]["slo_attainment"]
        eligible = {v: r for v, r in cell["validation"].items() if r["slo_attainment"] >= base - 1e-3}
        chosen = min(eligible, key=lambda v: eligible[v]["effective_cost_usd"])
        cell["chosen_on_validation"] = chosen
        jobs = [(args.scenario, market, args.world, args.rule, v, test, args.seed, args.workload)
                for v in names]
        bounds = sorted({"neutral", chosen}) if args.hindsight else []
        jobs += [(args.scenario, market, args.world, "hindsight", v, test, args.seed, args.workload)
                 for v in bounds]
        oracles = [o for o, on in (("oracle-rate", args.oracle_rate),
                                   ("oracle-quantile", args.oracle_quantile)) if on]
        level = parse_policy(args.rule).level  # oracle-quantile plans at the rule's own level
        quantile = f"oracle-quantile@{level:g}" if level is not None else "oracle-quantile"
        jobs += [(args.scenario, market, args.world, quantile if o == "oracle-quantile" else o,
                  chosen, test, args.seed, args.workload) for o in oracles]
        # oracle-quantile with every variant: the best of them is the bound with the same levers
        others = [v for v in names if v != chosen] if args.oracle_quantile else []
        jobs += [(args.scenario, market, args.world, quantile, v, test, args.seed, args.workload)
                 for v in others]
        outs = _run_all(jobs, args.workers, args.fresh)
        extra, outs = outs[len(outs) - len(others):], outs[:len(outs) - len(others)]
        cell["test"] = dict(zip(names, outs[:len(names)], strict=True))
        neutral, pick = cell["test"]["neutral"], cell["test"][chosen]
        cell["headline"] = {
            "chosen": chosen,
            "test_cost_ratio": round(pick["cost_usd"] / neutral["cost_usd"], 4),
            "test_effective_cost_ratio": round(pick["effective_cost_usd"] / neutral["effective_cost_usd"], 4),
            "test_slo_attainment": [neutral["slo_attainment"], pick["slo_attainment"]],
            "test_misses": [neutral["misses"], pick["misses"]],
        }
        if bounds:
            cell["hindsight"] = dict(zip(bounds, outs[len(names):len(names) + len(bounds)], strict=True))
            hs = cell["hindsight"][chosen]
            # the bound: what planning on the true demand with the chosen lever costs, against the rule
            cell["headline"]["hindsight_effective_cost_ratio"] = round(
                hs["effective_cost_usd"] / pick["effective_cost_usd"], 4)
        for o, oracle in zip(oracles, outs[len(outs) - len(oracles):], strict=True):
            key = o.replace("-", "_")
            cell[key] = {chosen: oracle}
            # a perfect forecast (of the rate; of its quantile) with the chosen lever, against the rule
            cell["headline"][f"{key}_effective_cost_ratio"] = round(
                oracle["effective_cost_usd"] / pick["effective_cost_usd"], 4)
        if others:
            quantiles = cell["oracle_quantile"]
            quantiles.update(zip(others, extra, strict=True))
            best = min(quantiles, key=lambda v: quantiles[v]["effective_cost_usd"])
            # the bound with the levers (chosen on the test days, as a bound may be), against the rule
            cell["headline"]["oracle_quantile_best"] = {
                "variant": best, "effective_cost_ratio": round(
                    quantiles[best]["effective_cost_usd"] / pick["effective_cost_usd"], 4)}
        doc["markets"][market] = cell
    doc["wall_seconds"] = round(time.perf_counter() - t0, 1)
    doc["load_after"] = [round(x, 2) for x in os.getloadavg()]
    emit(doc, args.out)


if __name__ == "__main__":
    main()
