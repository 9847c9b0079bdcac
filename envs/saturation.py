"""Demand, not service: what arrived at a saturated server.

A server at capacity serves its capacity whatever arrives, so its served rate is a lower bound of
demand, not demand. What arrived over an interval is what was served, plus what was left queued
(the growth of the waiting queue) and what gave up before being served (requests that timed out
or were cancelled: vLLM counts them as finished with reason ``abort``). Counted in requests —
every request has a prefill and a decode, and the abort counter and the queue are per model, not
per phase — the requests completed are those the slower phase got through:

    requests = min over phases (served tokens / tokens per request)
               + (waiting now - waiting before + aborted) / interval
    arrivals = requests x tokens per request, per phase (never below what the phase served)

One code path for the simulator and the live controller: the simulator's servers
(:func:`atoll.envs.latency.phase_signals`) lose the excess ``lam - mu`` of an overloaded step,
and :func:`abandoned_requests` turns that loss into the abort counter its exporter shows
(``atoll replay`` serving a plan), so a controller reading the counters recovers the demand the
simulator drew; the controller plans a saturated phase from :func:`planning_demand`.

The estimate is used only where a phase is saturated (:func:`saturated`): elsewhere the served
rate *is* the demand, and a queue that drains is served work, not lost demand. It is bounded by
what the plan's growth cap could add in one tick (``growth_factor`` x the instances serving +
``growth_add``, each serving what the saturated instances served on average), so one wrong
counter cannot multiply a plan; a real surge is caught over a few ticks as the capped plan
grows.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

# observed mean latency / its on-time mean at capacity: a phase this busy queues
SATURATED_RATIO = 0.999


def estimate_arrivals(served_tps: npt.ArrayLike, tokens_per_request: npt.ArrayLike,
                      waiting_before: npt.ArrayLike, waiting_now: npt.ArrayLike,
                      aborted_requests: npt.ArrayLike, interval_s: float) -> np.ndarray:
    """[M, 2] tokens/s that arrived per model and phase over an interval of ``interval_s``:
    ``served_tps`` [M, 2], ``tokens_per_request`` [M, 2], the waiting requests at its start and
    end [M] and the requests aborted in it [M] (NaN or missing: 0); see the module docstring.
    Never below what was served."""
    served = np.asarray(served_tps, dtype=float)
    tokens = np.asarray(tokens_per_request, dtype=float)
    before = np.nan_to_num(np.asarray(waiting_before, dtype=float))
    now = np.nan_to_num(np.asarray(waiting_now, dtype=float))
    aborted = np.nan_to_num(np.asarray(aborted_requests, dtype=float))
    if not interval_s > 0:
        return served.copy()
    with np.errstate(divide="ignore", invalid="ignore"):
        per_phase = np.where(tokens > 0, served / np.where(tokens > 0, tokens, 1.0), np.inf)
    completed = np.min(per_phase, axis=1)
    completed = np.where(np.isfinite(completed), completed, 0.0)
    requests = completed + (now - before + np.maximum(aborted, 0.0)) / interval_s
    return np.maximum(np.maximum(requests, 0.0)[:, None] * tokens, served)


def saturated(latency_ratio: npt.ArrayLike, unserved_requests: npt.ArrayLike) -> np.ndarray:
    """[M, 2] whether each phase is saturated: its observed mean latency at or past its mean at
    capacity (``latency_ratio`` [M, 2]; NaN: not measured). A model without any latency
    measurement but with requests left unserved (``unserved_requests`` [M]: queue growth plus
    aborted) counts its prefill phase as saturated: a queue waits for its first token."""
    ratio = np.nan_to_num(np.asarray(latency_ratio, dtype=float), nan=-1.0)
    out = ratio >= SATURATED_RATIO
    blind = np.all(ratio < 0, axis=1) & (np.nan_to_num(np.asarray(unserved_requests, dtype=float)) > 0)
    out[blind, 0] = True
    return out


def planning_demand(served_tps: npt.ArrayLike, arrivals_tps: npt.ArrayLike, is_saturated: npt.ArrayLike,
                    instances: npt.ArrayLike, growth_factor: float, growth_add: int) -> np.ndarray:
    """[M, 2] tokens/s a phase is planned from: the estimated arrivals where it is saturated,
    bounded by what the growth cap could add in one tick (see the module docstring), else what
    it served."""
    served = np.asarray(served_tps, dtype=float)
    arrivals = np.maximum(np.asarray(arrivals_tps, dtype=float), served)
    n = np.maximum(np.asarray(instances, dtype=float), 1.0)
    bound = served * (growth_factor + growth_add / n)
    return np.where(np.asarray(is_saturated, dtype=bool), np.minimum(arrivals, bound), served)


def abandoned_requests(lost_requests: npt.ArrayLike, queued_before: npt.ArrayLike,
                       queued_now: npt.ArrayLike) -> np.ndarray:
    """[M] requests an overloaded step's servers count as aborted: the step's unserved requests
    (``lost_requests``) less those still in the queue's growth, so that served + queue growth +
    aborted adds up to what arrived (a queue that shrinks gives its requests up as aborted)."""
    lost = np.asarray(lost_requests, dtype=float)
    growth = np.asarray(queued_now, dtype=float) - np.asarray(queued_before, dtype=float)
    return np.maximum(lost - growth, 0.0)
