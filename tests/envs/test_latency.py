"""The latency approximation against a discrete-event batch server, its inverse, its edge cases."""

from __future__ import annotations

import math
from collections import deque

import numpy as np
import pytest

from atoll.envs.latency import (
    VLLM_ITL_BUCKETS_S,
    VLLM_TTFT_BUCKETS_S,
    ServiceLatency,
    capacity_weight,
    histogram_counts,
    implied_capacity,
    latency_quantiles,
    mean_latency,
    phase_signals,
    poisson_excess,
)
from atoll.solvers.errors import InputError

ALPHA = 0.5
# prefill: B = 1 s, 1000-token prompts, 20 req/s at capacity -> 10 requests per full iteration
PREFILL_B, PREFILL_TOKENS, PREFILL_MAX_BATCH = 1.0, 1000.0, 10
# decode: B = 50 ms per token, 64 output tokens, 16 requests in a full batch (a small batch: bursty)
DECODE_B, DECODE_TOKENS, DECODE_MAX_BATCH = 0.05, 64, 16
# Tolerances of the approximation against the simulation (hand cases below):
MEAN_TOL = 0.10  # relative, mean latency of the requests served within the budget
ON_TIME_TOL = 0.05  # absolute, share of all requests that met the budget


def simulate_prefill(rho: float, seed: int, horizon_s: float = 3000.0) -> tuple[float, float]:
    """(mean TTFT of the on-time requests, on-time share) of one prefill instance.

    Poisson arrivals; at each iteration boundary the waiting requests join, at most the token
    budget (``PREFILL_MAX_BATCH`` requests); an iteration of b takes tau0 + beta b with the full one
    at B/2; an idle server starts at the next arrival. Scheduling is EDF with expiry: requests that
    can still make the budget (age <= B - B/2) go first in arrival order; the others wait for spare
    room (they are late anyway).
    """
    rng = np.random.default_rng(seed)
    full = PREFILL_B / 2
    tau0, beta = ALPHA * full, (1 - ALPHA) * full / PREFILL_MAX_BATCH
    n = rng.poisson(rho * PREFILL_MAX_BATCH / full * horizon_s)
    arrival = np.sort(rng.uniform(0.0, horizon_s, n))
    ttft = np.full(n, np.inf)
    head, stale, t = 0, deque[int](), 0.0
    while (head < n or stale) and t < horizon_s + 10 * PREFILL_B:
        while head < n and arrival[head] <= t and t - arrival[head] > PREFILL_B - full:
            stale.append(head)
            head += 1
        batch: list[int] = []
        while head < n and arrival[head] <= t and len(batch) < PREFILL_MAX_BATCH:
            batch.append(head)
            head += 1
        while stale and len(batch) < PREFILL_MAX_BATCH:
            batch.append(stale.popleft())
        if not batch:
            if head >= n:
                break
            t = float(arrival[head])
            continue
        t += tau0 + beta * len(batch)
        ttft[batch] = t - arrival[batch]
    keep = ttft[(arrival > 50.0) & (arrival < horizon_s - 10 * PREFILL_B)]
    on = keep <= PREFILL_B
    return float(keep[on].mean()), float(on.mean())


def simulate_decode(rho: float, seed: int, horizon_s: float = 1500.0) -> tuple[float, float]:
    """(mean inter-token latency per token, on-time share) of one decode instance.

    Poisson arrivals of requests of ``DECODE_TOKENS`` tokens; every waiting request joins the next
    iteration while the batch has room (at most ``DECODE_MAX_BATCH``, where an iteration takes B);
    each running request gets a token per iteration of tau0 + beta b. A request meets the budget
    if it gets a slot within its own duration at the budget (P x B): its ITLs are then <= B by the
    cap. Admission is EDF with expiry as in prefill.
    """
    rng = np.random.default_rng(seed)
    tau0, beta = ALPHA * DECODE_B, (1 - ALPHA) * DECODE_B / DECODE_MAX_BATCH
    grace = DECODE_TOKENS * DECODE_B
    n = rng.poisson(rho * DECODE_MAX_BATCH / DECODE_B / DECODE_TOKENS * horizon_s)
    arrival = np.sort(rng.uniform(0.0, horizon_s, n))
    admitted = np.full(n, np.inf)
    head, stale, t = 0, deque[int](), 0.0
    ids, left = np.empty(0, dtype=int), np.empty(0, dtype=int)
    tokens, token_time = 0, 0.0
    while t < horizon_s + 2 * grace:
        while head < n and arrival[head] <= t and t - arrival[head] > grace:
            stale.append(head)
            head += 1
        new: list[int] = []
        while head < n and arrival[head] <= t and len(new) < DECODE_MAX_BATCH - len(ids):
            new.append(head)
            head += 1
        while stale and len(new) < DECODE_MAX_BATCH - len(ids):
            new.append(stale.popleft())
        if new:
            admitted[new] = t
            ids = np.concatenate([ids, new])
            left = np.concatenate([left, np.full(len(new), DECODE_TOKENS)])
        if not len(ids):
            if head >= n:
                break
            t = max(t, float(arrival[head]))
            continue
        tau = tau0 + beta * len(ids)
        t += tau
        tokens += len(ids)
        token_time += len(ids) * tau
        left -= 1
        ids, left = ids[left > 0], left[left > 0]
    keep = (arrival > 3 * grace) & (arrival < horizon_s - 2 * grace)
    on = admitted[keep] - arrival[keep] <= grace
    return token_time / tokens, float(on.mean())


def prefill_service() -> ServiceLatency:
    return ServiceLatency(PREFILL_B, PREFILL_TOKENS, "prefill", ALPHA)


def decode_service() -> ServiceLatency:
    return ServiceLatency(DECODE_B, DECODE_TOKENS, "decode", ALPHA)


def one(service: ServiceLatency, rho: float, capacity: float, **kw: object) -> tuple[float, float]:
    s = phase_signals([rho * capacity], [capacity], [service], step_s=300.0, **kw)  # type: ignore[arg-type]
    return float(s.mean_latency_s[0]), float(s.on_time_share[0])


PREFILL_CAPACITY = PREFILL_MAX_BATCH / (PREFILL_B / 2) * PREFILL_TOKENS
DECODE_CAPACITY = DECODE_MAX_BATCH / DECODE_B


# phase -> (its discrete-event simulation, its service, one instance's capacity)
PHASES = {"prefill": (simulate_prefill, prefill_service, PREFILL_CAPACITY),
          "decode": (simulate_decode, decode_service, DECODE_CAPACITY)}


@pytest.mark.parametrize("phase", sorted(PHASES))
@pytest.mark.parametrize("rho", [0.3, 0.7, 0.9, 1.2])
def test_the_approximation_matches_the_simulation(phase: str, rho: float) -> None:
    simulate, service, capacity = PHASES[phase]
    des_mean, des_on = simulate(rho, seed=int(rho * 10))
    mean, on = one(service(), rho, capacity)
    assert abs(mean - des_mean) / des_mean <= MEAN_TOL, (mean, des_mean)
    assert abs(on - des_on) <= ON_TIME_TOL, (on, des_on)


@pytest.mark.parametrize("phase", ["prefill", "decode"])
@pytest.mark.parametrize("alpha", [0.2, 0.5, 0.8])
def test_implied_capacity_inverts_the_mean_latency(phase: str, alpha: float) -> None:
    rho = np.linspace(0.1, 0.99, 40)
    lat = mean_latency(rho, 0.8, alpha, phase)
    cap, informative = implied_capacity(rho * 5000.0, lat, 0.8, alpha, phase=phase)
    assert informative.all()
    np.testing.assert_allclose(cap, 5000.0, rtol=1e-9)
    w = capacity_weight(lat, 0.8, alpha, phase)
    assert np.all(np.diff(w) > 0) and w[0] < 0.05 * w[-1]


def test_implied_capacity_saturated_idle_and_unserved() -> None:
    cap, informative = implied_capacity([900.0, 900.0, 900.0, 0.0], [1.0, 1.3, 0.2, 0.6], 1.0, 0.5,
                                         phase="decode")
    assert cap[0] == cap[1] == 900.0 and informative[:2].all()  # at or above the budget: at capacity
    assert not informative[2] and math.isnan(cap[2])  # below the idle floor alpha B
    assert not informative[3]
    cap, informative = implied_capacity(900.0, 0.8, 1.0, 0.5, phase="prefill")  # above 3/4 B: saturated
    assert informative and cap == 900.0


def test_mixed_phases_vectorize() -> None:
    lat = mean_latency([0.5, 0.5], [1.0, 1.0], 0.5, ["prefill", "decode"])
    assert lat[0] == pytest.approx(0.75 * lat[1])


def test_zero_demand_and_zero_capacity() -> None:
    svc = [decode_service(), decode_service(), decode_service()]
    s = phase_signals([0.0, 100.0, 0.0], [300.0, 0.0, 0.0], svc, step_s=300.0)
    for name, v in s.__dict__.items():
        if isinstance(v, np.ndarray) and name != "utilization":
            assert np.all(np.isfinite(v)), name
    assert s.utilization[1] == np.inf and s.utilization[2] == 0.0
    assert s.on_time_share.tolist() == [1.0, 0.0, 1.0]
    assert s.served_tps.tolist() == [0.0, 0.0, 0.0]
    assert s.mean_latency_s[1] == DECODE_B  # latency at its cap
    assert s.waiting[1] == pytest.approx(100.0 / DECODE_TOKENS * 300.0 / 2)  # all queued, no carry-over
    assert s.waiting[0] == s.running[0] == 0.0 and s.histogram[:2].sum() == 0.0


@pytest.mark.parametrize("service", [prefill_service(), decode_service()])
def test_overload_serves_capacity_and_misses_the_excess(service: ServiceLatency) -> None:
    cap = 5000.0
    rho = np.linspace(0.0, 3.0, 61)
    for n in (1.0, 10.0, 300.0):
        s = phase_signals(rho * cap, np.full(rho.size, cap), [service] * rho.size, step_s=300.0,
                          instances=n)
        np.testing.assert_allclose(s.served_tps, np.minimum(rho, 1.0) * cap)
        assert np.all(s.on_time_share <= np.minimum(1.0, 1.0 / np.maximum(rho, 1e-12)) + 1e-12)
        assert np.all(np.diff(s.mean_latency_s) >= 0)
        if n <= 10:  # instances of a realistic size; beyond capacity p99 may fall: fewer served are late
            assert np.all(np.diff(s.p99_s[rho < 1]) >= -1e-12)
        assert np.all(s.kv_usage <= 1.0) and np.all(np.diff(s.kv_usage) >= 0)
        assert np.all(s.p50_s <= s.p90_s) and np.all(s.p90_s <= s.p99_s)
        assert np.all(s.mean_latency_s[rho > 1] <= service.budget_s)
        assert np.all(s.waiting[rho > 1] > s.waiting[(rho > 0) & (rho < 1)].max())
    # a large pooled service is nearly fluid: on time -> min(1, 1/rho)
    big = phase_signals(rho * 1e7, np.full(rho.size, 1e7), [service] * rho.size, step_s=300.0)
    np.testing.assert_allclose(big.on_time_share, np.minimum(1.0, 1.0 / np.maximum(rho, 1e-12)), atol=0.01)


def test_late_requests_sit_above_the_budget() -> None:
    s = phase_signals([9000.0], [10000.0], [prefill_service()], step_s=300.0)
    assert 0 < s.late_share[0] < 0.2 and s.late_latency_s[0] > PREFILL_B
    assert s.high_s[0] <= PREFILL_B
    q = latency_quantiles(s, [1.0 - s.late_share[0] / 2])
    assert q[0, 0] > PREFILL_B


def test_poisson_excess_exact_and_continuous_at_the_switch() -> None:
    m, c = 7.3, 9.6
    n = np.arange(200)
    pmf = np.exp(-m + n * math.log(m) - np.array([math.lgamma(k + 1.0) for k in n]))
    excess, over = poisson_excess(m, c)
    assert excess == pytest.approx(float(np.sum(np.maximum(n - c, 0) * pmf)), rel=1e-10)
    assert over == pytest.approx(float(pmf[n > c].sum()), rel=1e-10)
    cs = np.linspace(170.0, 240.0, 15)
    exact, _ = poisson_excess(np.full(cs.size, 200.0), cs)
    normal, _ = poisson_excess(np.full(cs.size, 200.0 + 1e-9), cs)
    assert np.max(np.abs(exact - normal)) / 200.0 < 0.001  # in late share


def test_poisson_excess_matches_the_sum_over_the_pmf_across_means_and_tails() -> None:
    """The exact branch against a direct sum of the pmf (to 40 sd past the mean) on a grid of means
    up to the switch and points from below the mean to far in the tail."""
    for m in (0.013, 0.7, 3.0, 19.5, 64.0, 131.0, 199.9):
        n = np.arange(int(m + 40 * math.sqrt(m) + 60))
        pmf = np.exp(-m + n * math.log(m) - np.array([math.lgamma(k + 1.0) for k in n]))
        cs = np.unique(np.concatenate([np.linspace(0.0, m + 15 * math.sqrt(m) + 10, 23), [m, m + 0.5]]))
        excess, over = poisson_excess(np.full(cs.size, m), cs)
        for c, e, o in zip(cs, excess, over, strict=True):
            assert e == pytest.approx(float(np.sum(np.maximum(n - c, 0) * pmf)), rel=1e-9, abs=1e-12 * m)
            assert o == pytest.approx(float(pmf[n > c].sum()), rel=1e-9, abs=1e-15)


def test_histograms_sum_to_the_requests_and_sampling_is_seeded() -> None:
    svc = [prefill_service(), prefill_service()]
    s = phase_signals([3000.0, 21000.0], [10000.0, 20000.0], svc, step_s=300.0, instances=[1, 2])
    assert s.edges == VLLM_TTFT_BUCKETS_S and s.histogram.shape == (2, len(VLLM_TTFT_BUCKETS_S) + 1)
    np.testing.assert_allclose(s.histogram.sum(axis=1), s.served_requests)
    a = histogram_counts(s, rng=np.random.default_rng(3))
    assert np.array_equal(a, histogram_counts(s, rng=np.random.default_rng(3)))
    assert not np.array_equal(a, histogram_counts(s, rng=np.random.default_rng(4)))
    assert np.all(np.abs(a.sum(axis=1) - s.served_requests) < 1.0) and np.all(a == np.round(a))
    d = phase_signals([200.0], [320.0], [decode_service()], step_s=300.0)
    assert d.edges == VLLM_ITL_BUCKETS_S
    tokens = d.served_tps * 300.0  # vLLM's ITL histogram observes every token
    np.testing.assert_allclose(histogram_counts(d, observations=tokens).sum(axis=1), tokens)


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"demand_tps": [-1.0]}, "demand_tps"),
    ({"demand_tps": [float("nan")]}, "demand_tps"),
    ({"capacity_tps": [float("inf")]}, "capacity_tps"),
    ({"instances": [0.0]}, "instances"),
    ({"step_s": 0.0}, "step_s"),
    ({"demand_tps": [1.0, 2.0]}, "demand_tps"),
])
def test_bad_signal_inputs_name_the_field(kwargs: dict[str, object], field: str) -> None:
    args: dict[str, object] = {"demand_tps": [1.0], "capacity_tps": [2.0], "step_s": 300.0, **kwargs}
    with pytest.raises(InputError, match=field):
        phase_signals(services=[decode_service()], **args)  # type: ignore[arg-type]


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"fixed_share": 0.0}, "fixed_share"),
    ({"fixed_share": 1.0}, "fixed_share"),
    ({"fixed_share": float("nan")}, "fixed_share"),
    ({"budget_s": -0.1}, "budget_s"),
    ({"tokens_per_request": float("nan")}, "tokens_per_request"),
    ({"phase": "encode"}, "phase"),
    ({"budget_s": True}, "budget_s"),
])
def test_bad_service_constants_name_the_field(kwargs: dict[str, object], field: str) -> None:
    args: dict[str, object] = {"budget_s": 1.0, "tokens_per_request": 100.0, "phase": "decode", **kwargs}
    with pytest.raises(InputError, match=field):
        ServiceLatency(**args)  # type: ignore[arg-type]


def test_budgets_from_the_model_slo() -> None:
    assert ServiceLatency.from_model("Llama-3-70B", "prefill", 1000).budget_s == pytest.approx(1.5)
    assert ServiceLatency.from_model("llama3-70b", "decode", 200).budget_s == pytest.approx(0.08)
    with pytest.raises(InputError, match="edges"):
        phase_signals([1.0, 1.0], [2.0, 2.0], [prefill_service(), decode_service()], step_s=300.0)


def test_poisson_excess_at_several_points_is_each_point_alone() -> None:
    """Several c in one call: exactly what one call per c gives, across the exact and
    the normal branches and a zero mean; shapes that do not broadcast are refused."""
    from atoll.envs.latency import EXACT_POISSON_MAX, poisson_excess_at

    rng = np.random.default_rng(3)
    m = np.concatenate([[0.0, EXACT_POISSON_MAX, EXACT_POISSON_MAX * 3], rng.uniform(0.1, 60, 5)])
    cs = [rng.uniform(0, 80, m.shape), np.zeros(m.shape), 12.5]
    together = poisson_excess_at(m, cs)
    for c, (excess, over) in zip(cs, together, strict=True):
        alone = poisson_excess(m, c)
        assert np.array_equal(excess, alone[0]) and np.array_equal(over, alone[1])
    with pytest.raises(InputError, match="broadcast"):
        poisson_excess_at(m, [np.zeros(3), np.zeros(m.shape)])


def test_the_inversions_inner_loop_is_phase_signals_to_the_bit() -> None:
    # servers.implied_capacities bisects on observed_latency: the same code as phase_signals
    from atoll.envs.latency import ServiceArrays, observed_latency

    rng = np.random.default_rng(7)
    services = [ServiceLatency.from_model(m, "decode", float(rng.uniform(20, 800)))
                for m in ("Qwen3-32B", "Phi-4-14B", "GPT-OSS-20B") * 4]
    for _ in range(20):
        d = rng.uniform(0, 5000, len(services)) * (rng.random(len(services)) > 0.2)
        cap = rng.uniform(0, 6000, len(services)) * (rng.random(len(services)) > 0.2)
        n = rng.integers(1, 9, len(services)).astype(float)
        full = phase_signals(d, cap, services, step_s=300.0, instances=n)
        observed, mean = observed_latency(d, cap, ServiceArrays.of(services), step_s=300.0, instances=n)
        assert np.array_equal(observed, full.observed_latency_s) and np.array_equal(mean, full.mean_latency_s)
