"""What vLLM servers report, per service and step: a documented queueing approximation.

Notation per service: budget ``B`` (s; TTFT for prefill, TPOT for decode), ``alpha`` = ``fixed_share``,
``P`` tokens per request (input for prefill, output for decode), demand ``D`` and profiled capacity
``C`` (tokens/s; the most the service serves *within* ``B``), ``n`` instances, step ``S`` (s).
``lam = D/P`` and ``mu = C/P`` requests/s, utilization ``rho = D/C`` (inf when C = 0 < D).

1. **Iteration-level batch server** (continuous batching): an iteration with batch ``b`` takes
   ``tau(b) = tau0 + beta b``. ``alpha`` is the share of an iteration at capacity that does not grow
   with the batch — an assumption (default 0.5), not fitted. The batch is capped where latency
   reaches the budget (KV cache / token budget), so capacity is exactly ``C``.
   - decode: ``tau0 = alpha B``, ``beta = (1-alpha) B / b*``, ``b* = C B / n`` per instance; the
     steady batch solves ``b = lam_tok tau(b)``, so ITL ``L = alpha B / (1 - (1-alpha) rho)``.
   - prefill: a request waits for the next iteration boundary, then runs in that iteration; the
     worst TTFT at rho = 1 is two full iterations, so ``tau* = B/2``, ``tau0 = alpha B/2``, a full
     iteration holds ``b* = mu B / (2 n)`` requests (the token budget); the
     iteration is ``t = tau0 / (1 - (1-alpha) rho)`` and TTFT ~ Uniform[t, 2t], mean
     ``L = 3/4 alpha B / (1 - (1-alpha) rho)``: the same hyperbola scaled by ``k = 3/4``.
   ``mean_latency`` is ``L = k alpha B / (1 - (1-alpha) rho)`` (k = 1 decode, 3/4 prefill) for
   rho <= 1, the mean of the requests served within the budget. Against a discrete-event
   simulation (tests, b* = 10-16) it runs 3-8% low: a request's own slot in its batch (~ beta, a
   1/b* share) is left out so that the curve needs no batch size and inverts exactly; at rho < 0.2
   an idle prefill server starts an iteration at once, and the curve is up to ~13% high there.
2. **Overload** (rho > 1): served = C; the excess ``lam - mu`` queues and is not served in the step
   (no carry-over): ``waiting += (lam - mu) S / 2``. The scheduler serves the requests that can still
   make the budget first (EDF with expiry — under plain FCFS a sustained overload would make every
   request late). Decode ITL sits at ``B``; prefill serves the oldest of the ``rho b*`` requests of
   an iteration that can still make it: TTFT ~ Uniform[B (1 - 1/(2 rho)), B], mean
   ``B (1 - 1/(4 rho))`` (continuous at rho = 1, -> B).
3. **Within-step burstiness**: per instance, arrivals in a window ``w`` are ``N ~ Poisson(m)``,
   ``m = lam w / n``, and the server completes ``c = m / rho`` requests in it; the excess misses:
   ``late = E[(N - c)+] / m``, ``on_time_share = 1 - late`` (of all demanded requests). Prefill:
   ``w = B``. Decode: ``w = P L`` (a request's duration) and the batch's free slots absorb a burst
   too, ``c = m / rho + b* (1 - kv_usage)`` (without them the DES misses by 0.09 at b* = 8; with
   them within 0.05); a decode request is late when it cannot get a slot within its own duration
   at the budget. The room is 0 at rho >= 1, and E[(N - m/rho)+] >= m (1 - 1/rho) (Jensen), so
   ``on_time <= min(1, 1/rho)``, with equality as m -> inf. E[(N - c)+] = m P(N >= k) - c P(N > k),
   k = floor(c), is exact from the Poisson pmf for m <= ``EXACT_POISSON_MAX`` (200), normal above.
   Late requests served in the step (rho < 1: all; rho > 1: ``mu - on-time``) drain from spare
   capacity: delay ``d = E[X | X > 0] / ((1 - rho) mu / n)``, X = (N - c)+, capped at S/2 (= S/2 for
   rho >= 1); P(X > 0) = P(N > c) is taken as its mean over [c - 1/2, c + 1/2] (the excess's slope
   across it), so the delay, and the mean latency, move continuously with the capacity; their
   latency is ``B + d`` (prefill) or ``B + d / P`` (decode: the wait spread over the tokens),
   Uniform[B, 2 late_latency - B].
4. **Signals**: running = served req/s x time in service (prefill: its iteration; decode: ``P L``),
   waiting = served req/s x time queued (wait for a boundary: ``L/3`` prefill, ``L/2`` decode) +
   late req/s x d + the overload term; ``kv_usage`` = mean batch / max batch =
   ``min(1, rho alpha / (1 - (1-alpha) rho))`` for both phases (decode: KV blocks of the batch;
   prefill: share of the token budget). On-time latencies are uniform on [lo, hi]: prefill as above;
   decode ``L +- h``, ``h = min(sqrt(3) beta sqrt(b), B - L, L - alpha B)`` from the Poisson batch.
   Quantiles and histograms are of the mixture (on time | late); vLLM's ITL histogram counts every
   token, so pass ``observations=`` served tokens of the step for it (the default counts requests).
5. **Inverse** (online correction): ``rho_hat = (1 - k alpha B / L) / (1 - alpha)``, the exact
   inverse of ``mean_latency`` on (k alpha B, k B); capacity = served / rho_hat. ``L >= k B``:
   saturated, capacity = served. ``L <= k alpha B`` (idle floor) or nothing served: unknown (NaN,
   not informative). Feed it ``mean_latency_s`` (the on-time mean), not ``observed_latency_s``,
   whose late tail would read as saturation. ``capacity_weight`` = (d ln L / d ln rho)^2 =
   ((1-alpha) rho / (1 - (1-alpha) rho))^2: the standard error of ln(capacity) is that of ln L over
   this elasticity, so low utilization (latency barely moves) weighs little.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt
from scipy.special import pdtrc

from atoll.solvers.errors import InputError
from atoll.solvers.models import get_model
from atoll.solvers.types import ModelSpec, Phase

FloatArray = npt.NDArray[np.float64]

DEFAULT_FIXED_SHARE = 0.5  # an assumption, not fitted: see the module docstring
PREFILL_SCALE = 0.75  # mean TTFT at capacity / budget (mean 1.5 iterations, worst 2)
EXACT_POISSON_MAX = 200.0  # Poisson means above this use the normal approximation
# Bucket upper edges of vLLM v0.11's histograms (vllm/v1/metrics/loggers.py, PrometheusStatLogger;
# v0.11 renamed time_per_output_token_seconds to inter_token_latency_seconds, same edges).
VLLM_TTFT_BUCKETS_S: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0, 160.0, 640.0, 2560.0)
VLLM_ITL_BUCKETS_S: tuple[float, ...] = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
    80.0)


@dataclass(frozen=True)
class ServiceLatency:
    """Per-service constants of the latency model (see the module docstring)."""

    budget_s: float
    tokens_per_request: float
    phase: Phase
    fixed_share: float = DEFAULT_FIXED_SHARE

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "phase", Phase(self.phase))
        except ValueError:
            raise InputError(f"ServiceLatency: field 'phase' must be one of {[p.value for p in Phase]}, "
                             f"got {self.phase!r}") from None
        for name in ("budget_s", "tokens_per_request"):
            v = getattr(self, name)
            if isinstance(v, bool) or not (isinstance(v, numbers.Real) and math.isfinite(v) and float(v) > 0):
                raise InputError(f"ServiceLatency: field {name!r} must be a finite number > 0, got {v!r}")
        a = self.fixed_share
        if isinstance(a, bool) or not (isinstance(a, numbers.Real) and 0.0 < float(a) < 1.0):
            raise InputError(f"ServiceLatency: field 'fixed_share' must lie in (0, 1), got {a!r}")

    @classmethod
    def from_model(cls, model: ModelSpec | str, phase: Phase | str, tokens_per_request: float,
                   fixed_share: float = DEFAULT_FIXED_SHARE) -> ServiceLatency:
        """The service of ``model`` (a spec, or a built-in model's name) in ``phase``, its budget
        from the model's SLO."""
        try:
            p = Phase(phase)
        except ValueError:
            raise InputError(f"ServiceLatency: field 'phase' must be one of {[v.value for v in Phase]}, "
                             f"got {phase!r}") from None
        spec = get_model(model) if isinstance(model, str) else model
        return cls(spec.slo.budget_ms(p) / 1000.0, tokens_per_request, p, fixed_share)


@dataclass(frozen=True)
class PhaseSignals:
    """One step's signals per service ([S] arrays; requests are counts, rates are per second).

    ``mean_latency_s`` is the model's mean over the requests served within the budget (what
    :func:`implied_capacity` inverts); ``observed_latency_s`` also counts the late ones (a vLLM
    histogram's sum / count). ``histogram``: expected counts [S, len(edges) + 1] of the requests
    served in the step (last column: above the last edge).
    """

    utilization: FloatArray
    served_tps: FloatArray
    requests: FloatArray
    served_requests: FloatArray
    on_time_share: FloatArray
    mean_latency_s: FloatArray
    late_latency_s: FloatArray
    observed_latency_s: FloatArray
    p50_s: FloatArray
    p90_s: FloatArray
    p99_s: FloatArray
    running: FloatArray
    waiting: FloatArray
    kv_usage: FloatArray
    budget_s: FloatArray
    low_s: FloatArray  # on-time latencies ~ Uniform[low_s, high_s]
    high_s: FloatArray
    late_share: FloatArray  # of the served requests
    edges: tuple[float, ...]
    histogram: FloatArray


def _scale(phase: Phase | str | Sequence[Phase | str]) -> FloatArray:
    phases = [phase] if isinstance(phase, str) else list(phase)
    try:
        k = [PREFILL_SCALE if Phase(p) is Phase.PREFILL else 1.0 for p in phases]
    except ValueError:
        raise InputError(f"field 'phase' must be prefill or decode, got {phase!r}") from None
    return np.array(k[0] if isinstance(phase, str) else k, dtype=float)


def mean_latency(rho: npt.ArrayLike, budget_s: npt.ArrayLike, fixed_share: npt.ArrayLike,
                 phase: Phase | str | Sequence[Phase | str]) -> FloatArray:
    """Mean latency (s) of the requests served within the budget at utilization ``rho``."""
    r, b, a, k = np.broadcast_arrays(np.asarray(rho, float), np.asarray(budget_s, float),
                                     np.asarray(fixed_share, float), _scale(phase))
    return _mean_latency(r, b, a, k)


def _mean_latency(r: FloatArray, b: FloatArray, a: FloatArray, k: FloatArray) -> FloatArray:
    under = k * a * b / (1.0 - (1.0 - a) * np.minimum(r, 1.0))
    with np.errstate(divide="ignore"):
        over = np.where(k < 1.0, b * (1.0 - 1.0 / (4.0 * np.maximum(r, 1.0))), b)
    return np.asarray(np.where(r <= 1.0, under, over), dtype=float)


def utilization_from_latency(mean_latency_s: npt.ArrayLike, budget_s: npt.ArrayLike,
                             fixed_share: npt.ArrayLike, phase: Phase | str | Sequence[Phase | str]
                             ) -> FloatArray:
    """The inverse of :func:`mean_latency` on rho in [0, 1] (clipped to it outside)."""
    lat, b, a, k = np.broadcast_arrays(np.asarray(mean_latency_s, float), np.asarray(budget_s, float),
                                       np.asarray(fixed_share, float), _scale(phase))
    with np.errstate(divide="ignore", invalid="ignore"):
        rho = (1.0 - k * a * b / lat) / (1.0 - a)
    return np.asarray(np.clip(np.nan_to_num(rho, nan=0.0, neginf=0.0), 0.0, 1.0), dtype=float)


def implied_capacity(served_tps: npt.ArrayLike, mean_latency_s: npt.ArrayLike, budget_s: npt.ArrayLike,
                     fixed_share: npt.ArrayLike = DEFAULT_FIXED_SHARE, *,
                     phase: Phase | str | Sequence[Phase | str]) -> tuple[FloatArray, npt.NDArray[np.bool_]]:
    """(capacity tokens/s, informative) from served tokens/s and the on-time mean latency."""
    served = np.asarray(served_tps, float)
    lat, b, a, k = np.broadcast_arrays(np.asarray(mean_latency_s, float), np.asarray(budget_s, float),
                                       np.asarray(fixed_share, float), _scale(phase))
    saturated = lat >= k * b * (1.0 - 1e-12)
    informative = (served > 0) & np.isfinite(lat) & (saturated | (lat > k * a * b * (1.0 + 1e-9)))
    rho = utilization_from_latency(lat, b, a, phase)
    with np.errstate(divide="ignore", invalid="ignore"):
        cap = np.where(saturated, served, served / rho)
    return np.asarray(np.where(informative, cap, np.nan), dtype=float), np.asarray(informative)


def capacity_weight(mean_latency_s: npt.ArrayLike, budget_s: npt.ArrayLike, fixed_share: npt.ArrayLike,
                    phase: Phase | str | Sequence[Phase | str]) -> FloatArray:
    """(d ln L / d ln rho)^2 at the observed latency: the relative precision of the implied capacity
    (0 at the idle floor, where latency barely moves with load)."""
    a = np.asarray(fixed_share, float)
    x = (1.0 - a) * utilization_from_latency(mean_latency_s, budget_s, fixed_share, phase)
    return np.asarray((x / (1.0 - x)) ** 2, dtype=float)


def _normal_sf(z: FloatArray) -> FloatArray:
    return np.asarray(0.5 * np.frompyfunc(math.erfc, 1, 1)(z / math.sqrt(2.0)), dtype=float)


def poisson_excess(m: npt.ArrayLike, c: npt.ArrayLike) -> tuple[FloatArray, FloatArray]:
    """(E[(N - c)+], P(N > c)) for N ~ Poisson(m): exact up to ``EXACT_POISSON_MAX``, normal above."""
    return poisson_excess_at(m, (c,))[0]


def poisson_excess_at(m: npt.ArrayLike, cs: Sequence[npt.ArrayLike]) -> list[tuple[FloatArray, FloatArray]]:
    """:func:`poisson_excess` of the same ``m`` at each of ``cs`` (the latency model reads the
    excess at c and c +- 1/2, and the online inversion calls it 9 times a step)."""
    m = np.asarray(m, dtype=float)
    try:
        shapes = [np.broadcast_shapes(m.shape, np.shape(c)) for c in cs]
    except ValueError:
        shapes = []
    if len(set(shapes)) > 1 or len(shapes) != len(cs):
        raise InputError(f"poisson_excess_at: every c must broadcast with m {m.shape} to one shape, got "
                         f"{[np.shape(c) for c in cs]}")
    shape = shapes[0] if shapes else m.shape
    m = np.array(np.broadcast_to(m, shape), dtype=float)
    points = [np.array(np.broadcast_to(np.asarray(c, float), shape), dtype=float) for c in cs]
    out = [(np.zeros(shape), np.zeros(shape)) for _ in points]
    small = (m > 0) & (m <= EXACT_POISSON_MAX)
    if small.any():
        ms = m[small]
        for c, (excess, over) in zip(points, out, strict=True):
            cs_ = c[small]
            kk = np.maximum(np.floor(cs_), 0.0)
            # the regularized incomplete gamma per row (pdtrc(k, m) = P(N > k)): O(rows), where a
            # table of the pmf up to 12 sd past the largest mean cost O(rows x 400) per call, half
            # of the online inversion's time; both agree to ~1e-14 of m
            p_gt_k = pdtrc(kk, ms)
            p_ge_k = np.where(kk > 0, pdtrc(np.maximum(kk - 1.0, 0.0), ms), 1.0)
            excess[small] = np.maximum(ms * p_ge_k - cs_ * p_gt_k, 0.0)
            over[small] = p_gt_k
    big = m > EXACT_POISSON_MAX
    if big.any():
        # no continuity shift: it is the closest of c, c +- 1/2 to the exact excess at the switch
        sd = np.sqrt(m[big])
        for c, (excess, over) in zip(points, out, strict=True):
            gap = c[big] - m[big]
            sf = _normal_sf(gap / sd)
            excess[big] = np.maximum(sd * np.exp(-0.5 * (gap / sd) ** 2) / math.sqrt(2 * math.pi) - gap * sf,
                                     0.0)
            over[big] = sf
    return out


def _uniform_cdf(x: FloatArray, lo: FloatArray, hi: FloatArray) -> FloatArray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(hi > lo, np.clip((x - lo) / (hi - lo), 0.0, 1.0), (x >= lo).astype(float))


def _cdf(s: PhaseSignals, x: FloatArray) -> FloatArray:
    """CDF of the step's latencies at x [S, E]: on time ~ U[low, high], late ~ U[B, 2 late - B]."""
    f = s.late_share[:, None]
    late_hi = (2.0 * s.late_latency_s - s.budget_s)[:, None]
    return ((1.0 - f) * _uniform_cdf(x, s.low_s[:, None], s.high_s[:, None])
            + f * _uniform_cdf(x, s.budget_s[:, None], late_hi))


def latency_quantiles(s: PhaseSignals, q: npt.ArrayLike) -> FloatArray:
    """Latency quantiles [S, Q] of the step's requests (the two mixture parts do not overlap)."""
    qq = np.atleast_1d(np.asarray(q, float))[None, :]
    f = s.late_share[:, None]
    b = s.budget_s[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        on = s.low_s[:, None] + np.clip(qq / (1.0 - f), 0.0, 1.0) * (s.high_s - s.low_s)[:, None]
        late = b + np.clip((qq - (1.0 - f)) / f, 0.0, 1.0) * 2.0 * (s.late_latency_s[:, None] - b)
    return np.asarray(np.where((qq <= 1.0 - f) | (f <= 0), on, late), dtype=float)


def histogram_counts(s: PhaseSignals, edges: Sequence[float] | None = None,
                     rng: np.random.Generator | None = None,
                     observations: npt.ArrayLike | None = None) -> FloatArray:
    """Counts per bucket [S, len(edges) + 1] (upper edges, then +Inf) of ``observations`` (default:
    the requests served in the step): expected counts, or a multinomial draw with ``rng`` (the total
    rounded stochastically to an integer)."""
    e = np.asarray(s.edges if edges is None else edges, dtype=float)
    if e.ndim != 1 or not np.all(np.isfinite(e)) or np.any(np.diff(e) <= 0):
        raise InputError(f"histogram_counts: field 'edges' must be finite and increasing, got {edges!r}")
    total = np.broadcast_to(np.asarray(s.served_requests if observations is None else observations, float),
                            s.served_requests.shape)
    if not np.all(np.isfinite(total) & (total >= 0)):
        raise InputError("histogram_counts: field 'observations' must be finite and >= 0")
    cdf = _cdf(s, np.broadcast_to(e, (len(total), len(e))))
    edge = np.ones((len(total), 1))
    probs = np.clip(np.diff(np.concatenate([0.0 * edge, cdf, edge], axis=1), axis=1), 0.0, None)
    if rng is None:
        return np.asarray(total[:, None] * probs, dtype=float)
    whole = np.floor(total) + (rng.random(total.shape) < total - np.floor(total))
    return np.stack([rng.multinomial(int(n), p / p.sum()) for n, p in zip(whole, probs, strict=True)]
                    ).astype(float).reshape(len(total), len(e) + 1)


def _field(name: str, value: npt.ArrayLike, size: int, positive: bool = False) -> FloatArray:
    try:
        v = np.broadcast_to(np.asarray(value, dtype=float), (size,)).astype(float)
    except (TypeError, ValueError):
        raise InputError(f"phase_signals: field {name!r} must be a number or one per service ({size}), "
                         f"got {value!r}") from None
    if not np.all(np.isfinite(v)) or np.any(v <= 0 if positive else v < 0):
        raise InputError(f"phase_signals: field {name!r} must be finite and {'> 0' if positive else '>= 0'}, "
                         f"got {np.asarray(value)!r}")
    return v


@dataclass(frozen=True)
class ServiceArrays:
    """The per-service constants of :func:`phase_signals` as arrays, built once for a sequence of
    services that is evaluated many times (the online inversion calls it 9 times a step)."""

    budget_s: FloatArray
    fixed_share: FloatArray
    tokens_per_request: FloatArray
    prefill: npt.NDArray[np.bool_]
    scale: FloatArray  # PREFILL_SCALE for prefill, 1 for decode
    phases: tuple[Phase, ...]

    def take(self, rows: npt.NDArray[np.intp]) -> ServiceArrays:
        """The constants of the services at ``rows`` (an inversion bisects only the services whose
        latency says something)."""
        phases = tuple(self.phases[i] for i in rows.tolist())
        return ServiceArrays(self.budget_s[rows], self.fixed_share[rows], self.tokens_per_request[rows],
                             self.prefill[rows], self.scale[rows], phases)

    @classmethod
    def of(cls, services: Sequence[ServiceLatency]) -> ServiceArrays:
        phases = tuple(sv.phase for sv in services)
        return cls(np.array([sv.budget_s for sv in services], dtype=float),
                   np.array([sv.fixed_share for sv in services], dtype=float),
                   np.array([sv.tokens_per_request for sv in services], dtype=float),
                   np.array([p is Phase.PREFILL for p in phases], dtype=bool),
                   _scale(list(phases)) if phases else np.zeros(0), phases)


@dataclass(frozen=True)
class _Core:
    """What every signal of a step derives from (see :func:`_core`)."""

    rho: FloatArray
    lam: FloatArray
    mu: FloatArray
    lat: FloatArray
    served_req: FloatArray
    kv: FloatArray
    bstar: FloatArray
    on_time: FloatArray
    late_req: FloatArray
    late_share: FloatArray
    drain: FloatArray
    late_lat: FloatArray
    observed: FloatArray


def _core(d: FloatArray, cap: FloatArray, n: FloatArray, step: float, sv: ServiceArrays) -> _Core:
    """The latency model's step for demand ``d`` and capacity ``cap`` tokens/s on ``n`` instances
    (validated arrays): one code path for :func:`phase_signals` and :func:`observed_latency`."""
    b, a, tok, pre = sv.budget_s, sv.fixed_share, sv.tokens_per_request, sv.prefill
    lam, mu = d / tok, cap / tok
    with np.errstate(divide="ignore", invalid="ignore"):
        rho = np.where(cap > 0, d / np.where(cap > 0, cap, 1.0), np.where(d > 0, np.inf, 0.0))
    lat = _mean_latency(*np.broadcast_arrays(rho, b, a, sv.scale))
    served_req = np.minimum(lam, mu)
    r1 = np.minimum(rho, 1.0)
    kv = np.where(cap > 0, np.minimum(1.0, r1 * a / (1.0 - (1.0 - a) * r1)), 0.0)
    bstar = np.where(cap > 0, cap * b / n, 1.0)  # decode: max batch per instance
    # burstiness, per instance: window w, m arrivals, c requests the server can take in it
    w = np.where(pre, b, tok * lat)
    m = lam * w / n
    with np.errstate(divide="ignore", invalid="ignore"):
        c = np.where(np.isfinite(rho) & (rho > 0), m / np.where(rho > 0, rho, 1.0), 0.0)
    c = c + np.where(pre, 0.0, bstar * (1.0 - kv))
    # P(N > c) is a step in c, and a step in the late requests' delay makes the mean latency jump
    # (and turn back) as capacity grows, which the online inversion cannot follow: use its mean
    # over [c - 1/2, c + 1/2], the slope of the (piecewise-linear) excess across that interval
    (excess, _), (below, _), (above, _) = poisson_excess_at(m, (c, np.maximum(c - 0.5, 0.0), c + 0.5))
    p_over = below - above
    with np.errstate(divide="ignore", invalid="ignore"):
        late = np.where(m > 0, excess / np.where(m > 0, m, 1.0), 0.0)
        on_time = np.where(np.isinf(rho), 0.0, np.where(d > 0, np.clip(1.0 - late, 0.0, 1.0), 1.0))
        late_req = np.maximum(served_req - on_time * lam, 0.0)
        late_share = np.where(served_req > 0, late_req / np.where(served_req > 0, served_req, 1.0), 0.0)
        spare = (1.0 - rho) * mu / n
        drain = np.where((rho < 1.0) & (spare > 0), excess / np.maximum(p_over, 1e-300) / spare, np.inf)
    drain = np.where(late_req > 0, np.minimum(drain, step / 2.0), 0.0)
    late_lat = b + np.where(pre, drain, drain / tok)
    observed = (1.0 - late_share) * lat + late_share * late_lat
    return _Core(rho, lam, mu, lat, served_req, kv, bstar, on_time, late_req, late_share, drain, late_lat,
                 observed)


def observed_latency(demand_tps: FloatArray, capacity_tps: FloatArray, sv: ServiceArrays, *, step_s: float,
                     instances: FloatArray) -> tuple[FloatArray, FloatArray]:
    """(``observed_latency_s``, ``mean_latency_s``) of :func:`phase_signals` for arrays its caller
    already checked (``instances`` >= 1), without the rest of the signals: the online inversion's
    inner loop. The same code computes them, so the values are phase_signals' to the bit."""
    core = _core(demand_tps, capacity_tps, instances, float(step_s), sv)
    return core.observed, core.lat


def phase_signals(demand_tps: npt.ArrayLike, capacity_tps: npt.ArrayLike, services: Sequence[ServiceLatency],
                  *, step_s: float, instances: npt.ArrayLike | None = None,
                  edges: Sequence[float] | None = None, summary_only: bool = False,
                  arrays: ServiceArrays | None = None) -> PhaseSignals:
    """The step's signals of each service from its demand and true capacity (tokens/s).

    step_s: the step's length (the overload queue builds over it); instances: how many instances
    share the load evenly (default 1: one pooled server); edges: histogram bucket edges (default
    vLLM's TTFT or ITL edges when all services are one phase); summary_only: leave the quantiles
    and the histogram at zero (they cost most of a call); arrays: ``ServiceArrays.of(services)``,
    when the caller keeps it. ``utilization`` is inf where there is demand and no capacity; every
    other field is finite.
    """
    size = len(services)
    d = _field("demand_tps", demand_tps, size)
    cap = _field("capacity_tps", capacity_tps, size)
    n = np.maximum(_field("instances", 1.0 if instances is None else instances, size, positive=True), 1.0)
    step = float(_field("step_s", step_s, 1, positive=True)[0])
    sv = arrays if arrays is not None else ServiceArrays.of(services)
    phases = sv.phases
    if edges is None and summary_only:
        edges = ()  # no histogram to bucket: services of both phases may be evaluated together
    elif edges is None:
        if len(set(phases)) > 1:
            raise InputError("phase_signals: field 'edges' is needed when the services mix phases")
        edges = VLLM_TTFT_BUCKETS_S if phases and phases[0] is Phase.PREFILL else VLLM_ITL_BUCKETS_S
    b, a, tok, pre = sv.budget_s, sv.fixed_share, sv.tokens_per_request, sv.prefill
    core = _core(d, cap, n, step, sv)
    rho, lam, mu, lat, served_req = core.rho, core.lam, core.mu, core.lat, core.served_req
    kv, bstar, on_time = core.kv, core.bstar, core.on_time
    late_req, late_share = core.late_req, core.late_share
    drain, late_lat = core.drain, core.late_lat

    # on-time latencies ~ Uniform[lo, hi]
    with np.errstate(divide="ignore"):
        pre_lo = np.where(rho <= 1.0, lat / 1.5, b * (1.0 - 1.0 / (2.0 * np.maximum(rho, 1.0))))
    pre_hi = np.where(rho <= 1.0, lat * 4.0 / 3.0, b)
    batch = kv * bstar
    half = np.clip(np.minimum(math.sqrt(3.0) * (1.0 - a) * b / bstar * np.sqrt(batch),
                              np.minimum(b - lat, lat - a * b)), 0.0, None)
    lo = np.where(pre, pre_lo, lat - half)
    hi = np.where(pre, pre_hi, lat + half)
    observed = core.observed

    in_service = np.where(pre, np.where(rho <= 1.0, lat / 1.5, b / 2.0), tok * lat)
    queued = np.where(pre, np.maximum(lat - in_service, 0.0), lat / 2.0)
    excess_rate = np.where(np.isinf(rho), lam, np.maximum(lam - mu, 0.0))
    running = served_req * in_service
    waiting = served_req * queued + late_req * drain + excess_rate * step / 2.0

    out = PhaseSignals(
        utilization=rho.astype(float),
        served_tps=np.minimum(d, cap), requests=lam * step, served_requests=served_req * step,
        on_time_share=on_time, mean_latency_s=lat, late_latency_s=late_lat, observed_latency_s=observed,
        p50_s=np.zeros(size), p90_s=np.zeros(size), p99_s=np.zeros(size), running=running, waiting=waiting,
        kv_usage=kv, budget_s=b, low_s=lo, high_s=hi, late_share=late_share, edges=tuple(edges),
        histogram=np.zeros((size, len(edges) + 1)))
    if summary_only:  # an inversion needs the means only: quantiles and histogram stay zero
        return out
    qs = latency_quantiles(out, [0.5, 0.9, 0.99])
    hist = histogram_counts(out, edges)
    return replace(out, p50_s=qs[:, 0], p90_s=qs[:, 1], p99_s=qs[:, 2], histogram=hist)
