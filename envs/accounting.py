"""A FleetEnv step's accounting: what was served within the SLO, the requests lost, the reward and
the step's ``info``.

- :func:`serve` — per model the share of requests that met the SLO (fluid: min over phases of
  served / demand; ``slo_model="latency"``: the servers' report), less the requests lost in
  flight by instances stopped without a drain (``scale_down="lose"``), and the demand, goodput and
  unserved tokens.
- :func:`lost_in_flight` — those lost requests, by Little's law.
- :func:`step_reward` — -scale x (cost $ + unserved $/Mtok x unserved Mtok + re-opt $ x models
  re-optimized).
- :func:`step_info` — the step's ``info``: per model and in total (FleetEnv's docstring).

Pure functions of their arguments: no randomness, no state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from atoll.envs.closed_loop import ServerLoop
from atoll.envs.config import FleetConfig, RewardWeights
from atoll.envs.fleet import FleetState
from atoll.envs.fleet_model import FleetModel
from atoll.envs.planner import PlanOutcome
from atoll.envs.servers import ServerReport
from atoll.envs.signals import served_shares, unserved_shares
from atoll.envs.vocabulary import Reoptimization
from atoll.solvers.problem import SolveStatus

__all__ = ["Decision", "Served", "lost_in_flight", "serve", "step_info", "step_reward"]


@dataclass(frozen=True)
class Decision:
    """A step's re-optimization: the action per model, the models re-optimized (``chosen``) and
    grown, the last plan's outcome (None: all on hold), the solver's seconds over every attempt
    and the instances per key whose spot nodes the market refused."""

    reopts: list[Reoptimization]
    chosen: frozenset[str]
    grow: frozenset[str]
    outcome: PlanOutcome | None = None
    solver_s: float = 0.0
    failed: dict[str, int] | None = None


@dataclass(frozen=True)
class Served:
    """A step's serving per model: request rates [M] req/s, demand and ready capacity [M, 2]
    tokens/s, the fluid served share, the SLO share, requests lost in flight, the unserved share the
    observation remembers, and demand, goodput and unserved tokens."""

    rates: np.ndarray
    demand: np.ndarray
    ready: np.ndarray
    fluid: np.ndarray
    share: np.ndarray
    lost_requests: np.ndarray
    unserved_share: np.ndarray
    demand_tok: np.ndarray
    goodput_tok: np.ndarray
    unserved_tok: np.ndarray


def request_seconds(fleet: FleetModel) -> np.ndarray:
    """[M] a request's duration at the SLO budgets: TTFT + output tokens x inter-token budget."""
    return np.array([spec.slo.ttft_ms / 1e3 + fleet.shape[i, 1] * spec.slo.tpot_ms / 1e3
                     for i, spec in enumerate(fleet.specs)])


def lost_in_flight(fleet: FleetModel, stopped: dict[str, int], ready: np.ndarray, rates: np.ndarray,
                   step_s: float) -> np.ndarray:
    """[M] requests lost by instances stopped without a drain: by Little's law, the stopped
    capacity's share of the model's serving (max over phases) x its request rate x a
    request's duration at the SLO budgets (TTFT + output tokens x inter-token budget), at most
    the step's requests."""
    gone = np.zeros((len(fleet.models), 2))
    for key, n in stopped.items():
        for mi, ph, thr in fleet.rows(key):
            gone[mi, ph] += n * thr
    total = ready + gone
    with np.errstate(divide="ignore", invalid="ignore"):
        frac = np.where(total > 0, gone / np.where(total > 0, total, 1.0), 0.0).max(axis=1)
    return np.minimum(frac * rates * request_seconds(fleet), rates * step_s)


def serve(config: FleetConfig, fleet: FleetModel, rates: np.ndarray, demand: np.ndarray, ready: np.ndarray,
          report: ServerReport | None, stopped: dict[str, int]) -> Served:
    """The step's serving of ``demand`` by ``ready`` capacity (see the module docstring);
    ``stopped``: the instances per key a scale-down stopped at this step."""
    dt = config.step_s
    fluid = served_shares(demand, ready)
    share = report.slo_share if report is not None and config.slo_model == "latency" else fluid
    lost_requests = np.zeros(len(fleet.models))
    if config.scale_down == "lose" and stopped:
        lost_requests = lost_in_flight(fleet, stopped, ready, rates, dt)
        with np.errstate(divide="ignore", invalid="ignore"):
            lost_share = np.where(rates > 0, lost_requests / np.where(rates > 0, rates * dt, 1.0), 0.0)
        share = np.clip(share - lost_share, 0.0, 1.0)
    unserved = (unserved_shares(demand, ready) if share is fluid
                else np.where(demand.sum(axis=1) > 0, 1.0 - share, 0.0))
    demand_tok = demand.sum(axis=1) * dt
    goodput_tok = share * demand_tok
    return Served(rates, demand, ready, fluid, share, lost_requests, unserved, demand_tok, goodput_tok,
                  demand_tok - goodput_tok)


def step_reward(w: RewardWeights, cost: np.ndarray, unserved_tok: np.ndarray, reoptimized: int) -> float:
    """-scale x (cost $ + unserved $/Mtok x unserved Mtok + re-opt $ x models re-optimized)."""
    return float(-w.scale * (cost.sum() + w.unserved_usd_per_mtok * unserved_tok.sum() / 1e6
                             + w.reopt_usd * reoptimized))


def _totals(s: Served, cost: np.ndarray, d: Decision, lost: np.ndarray, dt: float) -> dict[str, Any]:
    requests = float((s.rates * dt).sum())
    outcome = d.outcome
    return {
        "cost_usd": float(cost.sum()), "demand_tokens": float(s.demand_tok.sum()),
        "goodput_tokens": float(s.goodput_tok.sum()), "unserved_tokens": float(s.unserved_tok.sum()),
        "requests": requests,
        "slo_attainment": float((s.share * s.rates * dt).sum() / requests) if requests > 0 else 1.0,
        "reoptimizations": len(d.chosen), "solves": int(outcome is not None),
        "solver_seconds": d.solver_s, "preemptions": int(lost.sum()),
        "guard_resolves": outcome.guard_resolves if outcome is not None else 0,
    }


def _per_model(fleet: FleetModel, s: Served, cost: np.ndarray, d: Decision, lost: np.ndarray, dt: float,
               report: ServerReport | None) -> dict[str, dict[str, Any]]:
    per_model: dict[str, dict[str, Any]] = {}
    for i, name in enumerate(fleet.models):
        per_model[name] = {
            "cost_usd": float(cost[i]), "demand_tokens": float(s.demand_tok[i]),
            "goodput_tokens": float(s.goodput_tok[i]), "unserved_tokens": float(s.unserved_tok[i]),
            "requests": float(s.rates[i] * dt), "slo_attainment": float(s.share[i]),
            "reoptimizations": int(name in d.chosen),
            "solver_seconds": d.solver_s if name in d.chosen else 0.0,
            "preemptions": int(lost[i]),
            "demand_prefill": float(s.demand[i, 0]), "demand_decode": float(s.demand[i, 1]),
            "ready_prefill": float(s.ready[i, 0]), "ready_decode": float(s.ready[i, 1]),
        }
    if report is not None:
        for i, name in enumerate(fleet.models):
            per_model[name].update({
                "served_share": float(s.fluid[i]), "ttft_mean_s": float(report.ttft_mean_s[i]),
                "itl_mean_s": float(report.itl_mean_s[i]), "waiting": float(report.waiting[i]),
                "running": float(report.running[i]), "kv_usage": float(report.kv_usage[i])})
    return per_model


def step_info(config: FleetConfig, fleet: FleetModel, state: FleetState, s: Served, d: Decision,
              cost: np.ndarray, node_hours: tuple[float, float], lost: np.ndarray, servers: ServerLoop, *,
              step: int, day: int, seconds: float) -> dict[str, Any]:
    """The ``info`` of a step that served ``s`` after decision ``d``, billed ``cost`` [M] $ and
    ``node_hours`` (all, on-demand), and lost ``lost`` [M] instances to preemption at its end."""
    dt = config.step_s
    total = _totals(s, cost, d, lost, dt)
    models = _per_model(fleet, s, cost, d, lost, dt, servers.last_report)
    info: dict[str, Any] = {"step": step, "day": day, "seconds": seconds, "total": total, "models": models}
    outcome = d.outcome
    if outcome is not None:
        # whether the memo answered is left out: info must not depend on what ran before
        info["solve"] = {"status": outcome.status.value, "mode": outcome.mode, "message": outcome.message,
                         "gap": None if math.isnan(outcome.gap) else outcome.gap,
                         "guard_resolves": outcome.guard_resolves}
    total["served_requests"] = float((s.fluid * s.rates * dt).sum())
    if config.correction:
        info["correction"] = servers.correction.planning_factors()
        info["exposed_families"] = servers.exposed
    total["grows"] = len(d.grow)
    # a solve stopped by the time limit: its incumbent was applied, or (none found) the fleet held
    total["time_limited"] = int(outcome is not None and (
        outcome.status is SolveStatus.FEASIBLE_TIME_LIMIT or "time limit" in outcome.message))
    for name, r in zip(fleet.models, d.reopts, strict=True):
        models[name]["action"] = r.label()
    total["node_hours"], total["ondemand_node_hours"] = node_hours
    failed_by_model = np.zeros(len(fleet.models), dtype=int)
    for key, n in (d.failed or {}).items():
        failed_by_model[fleet.info(key)[0]] += n
    for i, name in enumerate(fleet.models):
        models[name]["failed_acquisitions"] = int(failed_by_model[i])
        models[name]["lost_in_flight"] = float(s.lost_requests[i])
    total["failed_acquisitions"] = int(failed_by_model.sum())
    total["lost_in_flight"] = float(s.lost_requests.sum())
    total["free_nodes"] = int(sum(state.warm_nodes().values()))
    return info
