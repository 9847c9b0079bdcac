"""The risk a re-plan takes, as a rule's lever: one rule (``fixed:1``) under risk variants
(headroom, spread over spot pools, on-demand floor), chosen on validation days and reported on
test days. Prints ONE JSON document (progress on stderr).

The world is the contest's: the calibration world (``capacity_error="calibration"``), the
latency SLO model (late requests count as missed), spot and hedged markets. Selection, per
market, on the validation days only: the variant of least effective cost (node $ + lost tokens
at the reward's $/M, a lost token being one not served within the SLO) among those whose SLO
attainment is at least the neutral plan's minus 0.001. Every variant is reported on the test
days, the chosen one marked; nothing on the test days chooses anything.

    .venv/bin/python benchmarks/risk.py [--scenario core] [--markets spot,hedged]
        [--validation-days 8-10] [--test-days 11-14] [--variants neutral,h0.85,...] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from emit import emit  # this folder's own module, imported while the folder is on sys.path

# Run as a script, this file's folder leads sys.path and its name would shadow the package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

from atoll.envs.config import FleetConfig  # noqa: E402
from atoll.envs.fleet_env import FleetEnv  # noqa: E402
from atoll.envs.policies import make_policy  # noqa: E402
from atoll.envs.rollout import run_policy  # noqa: E402
from atoll.solvers.problem import Risk  # noqa: E402

VARIANTS = ("neutral", "h0.85", "h0.7", "s0.5", "f0.3", "h0.85,s0.5", "h0.85,f0.3")
KEYS = ("cost_usd", "slo_attainment", "goodput_share", "preemptions", "ondemand_node_hour_share",
        "reoptimizations", "churn_per_hour")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _days(text: str) -> list[int]:
    a, _, b = text.partition("-")
    return list(range(int(a), int(b or a) + 1))


def _run(scenario: str, market: str, risk: Risk, days: list[int], seed: int) -> dict[str, Any]:
    config = FleetConfig(scenario=scenario, days=(min(days), max(days)), availability=market,
                         capacity_error="calibration", slo_model="latency", risk=risk)
    env = FleetEnv(config)
    t0 = time.perf_counter()
    ep = run_policy(env, make_policy("fixed:1", len(env.models)), days=days, seed=seed)
    totals = ep.totals()
    out = {k: round(float(totals.get(k, 0.0)), 6) for k in KEYS}
    lost = max(totals["demand_tokens"] - totals["goodput_tokens"], 0.0)  # not served within the SLO
    out["lost_mtok"] = round(lost / 1e6, 4)
    price = config.reward.unserved_usd_per_mtok
    out["effective_cost_usd"] = round(totals["cost_usd"] + price * lost / 1e6, 4)
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    out["load"] = round(os.getloadavg()[0], 2)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="core")
    ap.add_argument("--markets", default="spot,hedged")
    ap.add_argument("--validation-days", default="8-10")
    ap.add_argument("--test-days", default="11-14")
    ap.add_argument("--variants", default=";".join(VARIANTS),
                    help="risk labels separated by ';' (each e.g. h0.85,s0.5,f0.3)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    variants = [v for v in args.variants.split(";") if v]
    val, test = _days(args.validation_days), _days(args.test_days)
    doc: dict[str, Any] = {"scenario": args.scenario, "rule": "fixed:1", "world": "calibration",
                           "slo_model": "latency", "validation_days": val, "test_days": test,
                           "seed": args.seed, "load_before": [round(x, 2) for x in os.getloadavg()],
                           "markets": {}}
    t0 = time.perf_counter()
    for market in args.markets.split(","):
        cell: dict[str, Any] = {"validation": {}, "test": {}}
        for v in variants:
            if v.startswith("f") or ",f" in v:
                if market != "hedged":
                    continue  # an on-demand floor needs on-demand capacity to stand on
            log(f"{market} validation {v} ...")
            cell["validation"][v] = _run(args.scenario, market, Risk.parse(v), val, args.seed)
            log(f"  {cell['validation'][v]}")
        base = cell["validation"]["neutral"]["slo_attainment"]
        eligible = {v: r for v, r in cell["validation"].items() if r["slo_attainment"] >= base - 1e-3}
        chosen = min(eligible, key=lambda v: eligible[v]["effective_cost_usd"])
        cell["chosen_on_validation"] = chosen
        for v in cell["validation"]:
            log(f"{market} test {v} ...")
            cell["test"][v] = _run(args.scenario, market, Risk.parse(v), test, args.seed)
            log(f"  {cell['test'][v]}")
        neutral, pick = cell["test"]["neutral"], cell["test"][chosen]
        cell["headline"] = {
            "chosen": chosen,
            "test_cost_ratio": round(pick["cost_usd"] / neutral["cost_usd"], 4),
            "test_effective_cost_ratio": round(pick["effective_cost_usd"] / neutral["effective_cost_usd"], 4),
            "test_slo_attainment": [neutral["slo_attainment"], pick["slo_attainment"]],
        }
        doc["markets"][market] = cell
    doc["wall_seconds"] = round(time.perf_counter() - t0, 1)
    emit(doc, args.out)


if __name__ == "__main__":
    main()
