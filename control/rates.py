"""Token rates per model from successive :class:`~atoll.control.metrics.MetricsSnapshot` reads.

Pure logic: time comes only from the snapshots (their replicas' sample times), never from a
clock, so tests script snapshots and times freely.

Rules, per replica series of a model (then summed over the model's replicas):
- rate = increase / (this sample time - the previous sample time of that replica);
- counter reset (the replica restarted: its process start time changed, where exported, or —
  without one — the value fell below ``reset_fraction`` of the previous one) -> the new value is
  the increase since the reset, as Prometheus' ``rate()`` does;
- a counter that goes back by less than that (or with an unchanged start time) did not reset:
  a replica behind a load balancer answering out of turn, a lagging Prometheus replica. Taking
  it as a reset would count the whole counter as new tokens (a rate many times the real one),
  so the sample is held: the model is ``counter_backwards``, the baseline stays, and the next
  read above it rates the whole gap. After ``flat_hold_s`` the lower value becomes the baseline;
- counters that stop rising while their server still answers (a frozen exporter, or really no
  traffic) make the model ``stale_flat``: held, not read as zero demand, until a counter moves
  (the gap is then rated as a whole) or ``flat_hold_s`` seconds of flat samples have passed —
  then it is a real zero;
- a replica seen for the first time (or whose sample time went backwards) has no rate yet:
  the model is ``warming_up`` for one read;
- a replica with no new sample since the last read (the tick came before the next scrape)
  keeps its last rate;
- a replica that disappeared is dropped (scaled down or gone: its tokens are no longer served).

Histograms (tokens per request, TTFT, inter-token latency; see :mod:`atoll.control.metrics`)
are rated per replica the same way: the interval's increase of ``_sum``, ``_count`` and each
bucket; after a reset (the replica's counters restarted, or the histogram's count fell below
``reset_fraction`` of its previous value) the new values are the increase; a histogram that went
back by less is left out for that interval and its lower values become the baseline (a lost
interval only thins a mean, so there is nothing to hold); a replica without a new sample keeps
its last interval's increase. Per model: tokens per request = increase of ``_sum`` / increase
of ``_count``; requests/s = the count's increase / the interval; mean TTFT and ITL likewise;
latency bucket increases are summed over the replicas that share the same edges. A histogram
not exported, or without observations in the interval, gives None — never an error.

Guard rails (the controller passes ``limits``: per model the highest believable (prompt,
generation) tokens/s): a rate above its limit is an ``outlier`` — held, and its baselines stay,
so one bad sample (a counter read as 1e12) never reaches the planner; the next read rates the
whole gap from the old baseline, and if that is still above the limit a second interval has
confirmed it and it is used. A rate that is not finite (a counter near 1.7e308 over a short
interval overflows) or cannot be computed is ``invalid`` the same way, never an exception: a
sample that crashed the tick would crash it again at every restart, since that tick is never
saved.

A model absent from a read is ``missing`` (a model whose plan went to zero has no server and no
series: it is held at zero until its series comes back, then re-planned like a new one); one
whose read has a NaN, an infinite or a missing series is ``invalid``. Neither gets a rate
(``None``, never 0: a zero would let the planner scale the model down), and neither moves the
model's baseline, so the next good read rates the whole gap. Expected models are those given
at construction plus every model seen so far.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from atoll.control.metrics import HISTOGRAMS, Histogram, MetricsSnapshot, ModelMetrics, SeriesSample


class RateStatus(enum.StrEnum):
    OK = "ok"
    WARMING_UP = "warming_up"
    MISSING = "missing"
    INVALID = "invalid"
    COUNTER_BACKWARDS = "counter_backwards"
    STALE_FLAT = "stale_flat"
    OUTLIER = "outlier"


RESET_FRACTION = 0.5  # a counter falling below half its previous value restarted
FLAT_HOLD_S = 900.0  # flat counters are held this long before they count as zero demand


@dataclass(frozen=True)
class ModelRate:
    """One model's rates over the last interval; rates are ``None`` unless ``status`` is ok.

    prompt/generation rates in tokens/s; waiting/running in requests (summed over replicas);
    kv_usage a fraction in [0, 1]; interval_s the longest replica interval the rate covers;
    resets the counter resets seen in it; reason says why a model has no rate.

    From vLLM's histograms, over the same interval (None when not exported or without
    observations in it): requests_per_s finished requests/s (the count of
    ``vllm:request_prompt_tokens``); prompt/generation_tokens_per_request tokens per finished
    request; ttft_mean_s and itl_mean_s mean time to first token and inter-token latency
    (seconds, as the servers measured them: never time-scaled), ttft_count/itl_count their
    observations, ttft_buckets/itl_buckets the interval's bucket increases as (le, cumulative
    count), edges as exported (+Inf last).
    """

    model: str
    status: RateStatus
    prompt_tokens_per_s: float | None = None
    generation_tokens_per_s: float | None = None
    waiting: float | None = None
    running: float | None = None
    kv_usage: float | None = None
    interval_s: float | None = None
    resets: int = 0
    reason: str = ""
    requests_per_s: float | None = None
    prompt_tokens_per_request: float | None = None
    generation_tokens_per_request: float | None = None
    ttft_mean_s: float | None = None
    itl_mean_s: float | None = None
    ttft_count: float | None = None
    itl_count: float | None = None
    ttft_buckets: tuple[tuple[float, float], ...] | None = None
    itl_buckets: tuple[tuple[float, float], ...] | None = None
    # requests aborted per second (timed out or cancelled before they finished), where exported
    aborted_per_s: float | None = None

    def __post_init__(self) -> None:
        owner = f"ModelRate {self.model!r}"
        object.__setattr__(self, "status", RateStatus(self.status))
        for name in ("aborted_per_s", "requests_per_s", "prompt_tokens_per_request",
                     "generation_tokens_per_request", "ttft_mean_s", "itl_mean_s", "ttft_count", "itl_count"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                      or not math.isfinite(value) or value < 0):
                raise ValueError(f"{owner}: field '{name}' must be None or finite and >= 0, got {value!r}")
        for name in ("ttft_buckets", "itl_buckets"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, Histogram(0.0, 0.0, tuple(value)).buckets)  # validates
        for name in ("prompt_tokens_per_s", "generation_tokens_per_s"):
            value = getattr(self, name)
            if self.status is RateStatus.OK:
                if value is None or not math.isfinite(value) or value < 0:
                    raise ValueError(f"{owner}: field '{name}' must be finite and >= 0 when the status "
                                     f"is ok, got {value!r}")
            elif value is not None:
                raise ValueError(f"{owner}: field '{name}' must be None when the status is "
                                 f"{self.status.value}, got {value!r}")

    @property
    def ok(self) -> bool:
        return self.status is RateStatus.OK

    def as_dict(self) -> dict[str, Any]:
        return {"model": self.model, "status": self.status.value,
                "prompt_tokens_per_s": self.prompt_tokens_per_s,
                "generation_tokens_per_s": self.generation_tokens_per_s, "waiting": self.waiting,
                "running": self.running, "kv_usage": self.kv_usage, "interval_s": self.interval_s,
                "resets": self.resets, "reason": self.reason, "requests_per_s": self.requests_per_s,
                "prompt_tokens_per_request": self.prompt_tokens_per_request,
                "generation_tokens_per_request": self.generation_tokens_per_request,
                "ttft_mean_s": self.ttft_mean_s, "itl_mean_s": self.itl_mean_s,
                "ttft_count": self.ttft_count, "itl_count": self.itl_count,
                "ttft_buckets": _buckets_json(self.ttft_buckets),
                "itl_buckets": _buckets_json(self.itl_buckets), "aborted_per_s": self.aborted_per_s}


def _buckets_json(buckets: tuple[tuple[float, float], ...] | None) -> list[list[Any]] | None:
    return None if buckets is None else [["+Inf" if le == math.inf else le, c] for le, c in buckets]


@dataclass(frozen=True)
class RateReport:
    """The rates of every expected model after one read."""

    time_s: float
    models: Mapping[str, ModelRate] = field(default_factory=dict)

    @property
    def fresh(self) -> tuple[str, ...]:
        """Models with a usable rate this read."""
        return tuple(m for m, r in self.models.items() if r.ok)

    @property
    def held(self) -> dict[str, str]:
        """Models without a rate this read -> why (the controller holds their plan)."""
        return {m: f"{r.status.value}: {r.reason}" for m, r in self.models.items() if not r.ok}

    def as_dict(self) -> dict[str, Any]:
        return {"time_s": self.time_s, "models": {m: r.as_dict() for m, r in self.models.items()}}


@dataclass(frozen=True)
class _Last:
    time_s: float
    prompt: float
    generation: float
    prompt_rate: float | None = None
    generation_rate: float | None = None
    start_s: float | None = None
    hist: Mapping[str, Histogram] = field(default_factory=dict)  # cumulative baselines
    # the last interval's increases and that interval's seconds (a replica without a new sample
    # keeps them, as it keeps its last token rates)
    hist_delta: Mapping[str, Histogram] = field(default_factory=dict)
    hist_dt: float | None = None
    aborted: float | None = None  # cumulative aborted requests (baseline)
    aborted_rate: float | None = None


def _hist_delta(old: Histogram | None, new: Histogram, restarted: bool, fraction: float
                ) -> tuple[Histogram | None, Histogram]:
    """(the interval's increase or None, the next baseline) of one histogram of one replica."""
    if old is None:
        return None, new  # first seen: a baseline, no increase yet
    if restarted or new.count < fraction * old.count:
        return new, new  # reset: everything since the restart is new
    back = new.count < old.count or new.sum < old.sum or any(
        n < o for (le_o, o), (le_n, n) in zip(old.buckets, new.buckets, strict=False) if le_o == le_n)
    if back:
        return None, new  # went back by less: this interval is left out, the lower value is the baseline
    same_edges = [le for le, _ in old.buckets] == [le for le, _ in new.buckets]
    buckets = tuple((le, max(n - o, 0.0)) for (le, o), (_, n) in zip(old.buckets, new.buckets, strict=True)) \
        if same_edges else ()
    # the increases are the new observations' cumulative counts, non-decreasing in le; a running
    # maximum removes the rounding dips a subtraction of large counts can leave
    running = 0.0
    buckets = tuple((le, running := max(running, c)) for le, c in buckets)
    return Histogram(new.sum - old.sum, new.count - old.count, buckets), new


def _histogram_fields(parts: list[tuple[Mapping[str, Histogram], float]]) -> dict[str, Any]:
    """ModelRate's histogram fields from each replica's (increases by kind, interval seconds)."""
    out: dict[str, Any] = {}
    for kind in HISTOGRAMS:
        got = [(d[kind], dt) for d, dt in parts if kind in d]
        if not got:
            continue  # not exported by any replica: None
        total = math.fsum(h.sum for h, _ in got)
        count = math.fsum(h.count for h, _ in got)
        mean = total / count if count > 0 else None
        if kind in ("prompt_tokens", "generation_tokens"):
            out[f"{kind}_per_request"] = mean
            if "requests_per_s" not in out or kind == "prompt_tokens":
                out["requests_per_s"] = math.fsum(h.count / dt for h, dt in got if dt > 0)
            continue
        out[f"{kind}_mean_s"], out[f"{kind}_count"] = mean, count
        edges = {tuple(le for le, _ in h.buckets) for h, _ in got}
        if len(edges) == 1 and next(iter(edges)):  # the same edges everywhere: buckets add up
            sums = [math.fsum(c) for c in zip(*([c for _, c in h.buckets] for h, _ in got), strict=True)]
            out[f"{kind}_buckets"] = tuple(zip(next(iter(edges)), sums, strict=True))
    return out


def _restarted(last: _Last, s: SeriesSample, fraction: float) -> bool | None:
    """True if the replica restarted since ``last``, False if a counter went back without a
    restart, None if neither counter went back."""
    known = last.start_s is not None and s.start_time_s is not None
    if known and s.start_time_s != last.start_s:
        return True
    pairs = ((last.prompt, s.prompt_tokens), (last.generation, s.generation_tokens))
    drops = [(old, new) for old, new in pairs if new < old]
    if not drops:
        return None
    return False if known else all(new < fraction * old for old, new in drops)


def _gauge(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


class RateTracker:
    """Successive snapshots in, per-model rates out (see the module docstring for the rules).

    ``baseline`` (a snapshot of each model's last good replica samples) is what to persist;
    pass it back as ``baseline=`` after a restart and the first read already yields rates.
    """

    def __init__(self, models: Iterable[str] = (), baseline: MetricsSnapshot | None = None, *,
                 reset_fraction: float = RESET_FRACTION, flat_hold_s: float = FLAT_HOLD_S,
                 only_expected: bool = False) -> None:
        if not (isinstance(reset_fraction, int | float) and 0 < reset_fraction < 1):
            raise ValueError(f"RateTracker: field 'reset_fraction' must be in (0, 1), got {reset_fraction!r}")
        if not (isinstance(flat_hold_s, int | float) and math.isfinite(flat_hold_s) and flat_hold_s >= 0):
            raise ValueError(f"RateTracker: field 'flat_hold_s' must be >= 0 seconds, got {flat_hold_s!r}")
        self.reset_fraction, self.flat_hold_s = float(reset_fraction), float(flat_hold_s)
        self._expected: set[str] = set(models)
        # only_expected: names outside ``models`` are neither tracked nor reported (the
        # controller's fleet is fixed; a scrape naming a new model each tick must not grow
        # memory or the persisted baseline without bound)
        self.only_expected = bool(only_expected)
        self._series: dict[str, dict[str, _Last]] = {}
        self._time: float | None = None
        self._suspect: set[str] = set()  # models whose last rate was held as an outlier
        if baseline is not None:
            self._time = baseline.time_s
            for model, mm in baseline.models.items():
                if self.only_expected and model not in self._expected:
                    continue
                self._expected.add(model)
                self._series[model] = {
                    s.series: _Last(s.time_s, s.prompt_tokens, s.generation_tokens, start_s=s.start_time_s,
                                    hist=s.histograms, aborted=s.aborted)
                    for s in mm.series
                    if math.isfinite(s.prompt_tokens) and math.isfinite(s.generation_tokens)}

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(sorted(self._expected))

    def forget(self, model: str) -> None:
        """Stop expecting ``model`` (it left the fleet), so it is no longer reported missing."""
        self._expected.discard(model)
        self._series.pop(model, None)

    @property
    def baseline(self) -> MetricsSnapshot:
        models = {m: ModelMetrics(tuple(SeriesSample(rid, last.time_s, last.prompt, last.generation,
                                                     last.start_s, last.hist, last.aborted)
                                        for rid, last in sorted(reps.items())), None, None)
                  for m, reps in sorted(self._series.items())}
        return MetricsSnapshot(self._time if self._time is not None else 0.0, models, "baseline")

    def update(self, snapshot: MetricsSnapshot,
               limits: Mapping[str, tuple[float, float]] | None = None) -> RateReport:
        """Rates of every expected model from ``snapshot``; ``limits``: model -> the highest
        believable (prompt, generation) tokens/s, in the snapshot's time (see the module
        docstring: a rate above it is held once as an outlier)."""
        out: dict[str, ModelRate] = {}
        names = self._expected if self.only_expected else self._expected | set(snapshot.models)
        for model in sorted(names):
            self._expected.add(model)
            mm = snapshot.models.get(model)
            if mm is None:
                out[model] = ModelRate(model, RateStatus.MISSING,
                                       reason=f"no series for it in {snapshot.source or 'the read'}")
            elif mm.problems:
                out[model] = ModelRate(model, RateStatus.INVALID, waiting=_gauge(mm.waiting),
                                       running=_gauge(mm.running), kv_usage=_gauge(mm.kv_usage),
                                       reason="; ".join(mm.problems))
            else:
                out[model] = self._guarded(model, mm, (limits or {}).get(model))
        self._time = snapshot.time_s
        return RateReport(snapshot.time_s, out)

    def _guarded(self, model: str, mm: ModelMetrics, limit: tuple[float, float] | None) -> ModelRate:
        """``_rate`` behind the guard rails: a rate that cannot be computed, is not finite or is
        above ``limit`` for the first interval is held with the model's baselines unchanged."""
        previous = self._series.get(model)
        gauges: dict[str, Any] = {"waiting": _gauge(mm.waiting), "running": _gauge(mm.running),
                                  "kv_usage": _gauge(mm.kv_usage)}

        def hold(status: RateStatus, reason: str) -> ModelRate:
            if previous is None:
                self._series.pop(model, None)
            else:
                self._series[model] = previous
            return ModelRate(model, status, **gauges, reason=reason)

        try:
            rate = self._rate(model, mm)
        except (ValueError, ArithmeticError) as exc:  # e.g. an interval's rate overflowing to inf
            self._suspect.discard(model)
            return hold(RateStatus.INVALID, f"its rate cannot be computed ({exc}); sample held")
        if not rate.ok or limit is None:
            return rate
        p, g = rate.prompt_tokens_per_s or 0.0, rate.generation_tokens_per_s or 0.0
        over = p > limit[0] or g > limit[1]
        if not over:
            self._suspect.discard(model)
            return rate
        if model in self._suspect:  # the second interval in a row above the limit: a real surge
            self._suspect.discard(model)
            return replace(rate, reason=f"above the outlier limit ({limit[0]:.4g} / {limit[1]:.4g} tokens/s) "
                                        f"two intervals running: used")
        self._suspect.add(model)
        return hold(RateStatus.OUTLIER,
                    f"{p:.4g} prompt / {g:.4g} generation tokens/s is above the outlier limit "
                    f"({limit[0]:.4g} / {limit[1]:.4g}: beyond what the fleet could serve or far above "
                    f"the model's recent range); held until a second interval confirms it")

    def _rate(self, model: str, mm: ModelMetrics) -> ModelRate:
        """The model's rate from its replicas' samples (the module docstring's rules); the new
        baselines are kept unless the model is held flat (then the flat replicas' stay)."""
        previous = self._series.get(model, {})
        read = _Read()
        for s in mm.series:
            _read_replica(read, previous.get(s.series), s, self.reset_fraction, self.flat_hold_s)
        waiting, running, kv = _gauge(mm.waiting), _gauge(mm.running), _gauge(mm.kv_usage)
        gauges: dict[str, Any] = {"waiting": waiting, "running": running, "kv_usage": kv}
        if read.flat and not read.moved and not read.backwards:
            since = min(last.time_s for last in read.flat.values())
            newest = max(s.time_s for s in mm.series if s.series in read.flat)
            if newest - since < self.flat_hold_s:
                read.current.update(read.flat)  # keep the baselines: a move rates the whole flat stretch
                self._series[model] = read.current
                return ModelRate(model, RateStatus.STALE_FLAT, **gauges, resets=read.resets,
                                 reason=f"counters flat for {newest - since:.0f} s while the server answers "
                                        f"(a frozen exporter, or no traffic); held until they move or "
                                        f"{self.flat_hold_s:.0f} s pass")
        self._series[model] = read.current
        return _verdict(model, read, gauges, self.reset_fraction)


@dataclass
class _Read:
    """One model's replicas read so far: the next baselines (``current``), the summed token
    rates, resets counted, the longest interval, the replicas warming up or gone back, those with
    a new sample and no increase (-> their old baseline), whether any counter moved, and per
    replica the histogram increases (with their seconds) and aborted requests/s."""

    current: dict[str, _Last] = field(default_factory=dict)
    prompt: float = 0.0
    generation: float = 0.0
    resets: int = 0
    span: float | None = None
    warming: list[str] = field(default_factory=list)
    backwards: list[str] = field(default_factory=list)
    flat: dict[str, _Last] = field(default_factory=dict)
    moved: bool = False
    hists: list[tuple[Mapping[str, Histogram], float]] = field(default_factory=list)
    aborts: list[float] = field(default_factory=list)


def _first(s: SeriesSample) -> _Last:
    """A replica's sample as a baseline with no rate yet."""
    return _Last(s.time_s, s.prompt_tokens, s.generation_tokens, start_s=s.start_time_s, hist=s.histograms,
                 aborted=s.aborted)


def _read_replica(read: _Read, last: _Last | None, s: SeriesSample, reset_fraction: float,
                  flat_hold_s: float) -> None:
    """Add one replica's sample to ``read``: a first sample (or one whose time went back) warms
    up, an unchanged one keeps its last rate, a counter gone back without a restart is held
    (until ``flat_hold_s``, then it is the new baseline), anything else is rated."""
    if last is None or s.time_s < last.time_s:
        read.current[s.series] = _first(s)
        read.warming.append(s.series)
        return
    if s.time_s == last.time_s:
        # no scrape since the last read: the replica's last rate still stands
        read.current[s.series] = last
        if last.prompt_rate is None or last.generation_rate is None:
            read.warming.append(s.series)
            return
        p, g = last.prompt_rate, last.generation_rate
        if last.hist_dt:
            read.hists.append((last.hist_delta, last.hist_dt))
        if last.aborted_rate is not None:
            read.aborts.append(last.aborted_rate)
    else:
        dt = s.time_s - last.time_s
        restarted = _restarted(last, s, reset_fraction)
        if restarted is False and dt < flat_hold_s:
            read.current[s.series] = last  # held: the next read above the baseline rates the gap
            read.backwards.append(f"replica {s.series!r}: {_went_back(last, s)}")
            return
        if restarted is False:  # went back and stayed back: the lower value is the baseline
            read.current[s.series] = _first(s)
            read.warming.append(s.series)
            return
        p, g = _rate_interval(read, last, s, dt, bool(restarted), reset_fraction)
    read.prompt += p
    read.generation += g


def _rate_interval(read: _Read, last: _Last, s: SeriesSample, dt: float, restarted: bool,
                   reset_fraction: float) -> tuple[float, float]:
    """One replica's (prompt, generation) tokens/s over the ``dt`` seconds since ``last`` (after a
    restart the new values are the increase); its histogram increases, aborted requests/s and
    new baseline go into ``read``."""
    if restarted:
        dp, dg = s.prompt_tokens, s.generation_tokens
        went_back = (s.prompt_tokens < last.prompt) + (s.generation_tokens < last.generation)
        read.resets += went_back or 1  # a new start time with both counters above: one reset
    else:
        dp, dg = s.prompt_tokens - last.prompt, s.generation_tokens - last.generation
    p, g = dp / dt, dg / dt
    deltas: dict[str, Histogram] = {}
    bases: dict[str, Histogram] = {}
    for kind, h in s.histograms.items():
        d, bases[kind] = _hist_delta(last.hist.get(kind), h, restarted, reset_fraction)
        if d is not None:
            deltas[kind] = d
    aborted_rate = None
    if s.aborted is not None and last.aborted is not None:
        gone = s.aborted if restarted else s.aborted - last.aborted
        aborted_rate = gone / dt if gone >= 0 else None  # went back: left out
        if aborted_rate is not None:
            read.aborts.append(aborted_rate)
    read.current[s.series] = _Last(s.time_s, s.prompt_tokens, s.generation_tokens, p, g,
                                   s.start_time_s, bases, deltas, dt, s.aborted, aborted_rate)
    read.hists.append((deltas, dt))
    if dp == 0 and dg == 0 and not restarted:
        read.flat[s.series] = last
    else:
        read.moved = True
    read.span = dt if read.span is None else max(read.span, dt)
    return p, g


def _verdict(model: str, read: _Read, gauges: dict[str, Any], reset_fraction: float) -> ModelRate:
    """The model's rate once its replicas are read (and it is not held flat): held while a
    counter is back or a replica warms up, else the summed rates (an error when not finite)."""
    if read.backwards:
        return ModelRate(model, RateStatus.COUNTER_BACKWARDS, **gauges, resets=read.resets,
                         reason="; ".join(read.backwards) + f" — not below {reset_fraction:.0%} of it "
                                f"and "
                                f"no restart, so not a reset; sample held")
    if read.warming:
        return ModelRate(model, RateStatus.WARMING_UP, **gauges, resets=read.resets,
                         reason=f"first sample of replica(s) {', '.join(map(repr, read.warming))}; "
                                f"a rate needs the next read")
    prompt, generation = read.prompt, read.generation
    if not (math.isfinite(prompt) and math.isfinite(generation)):
        raise ArithmeticError(f"{prompt:.4g} prompt / {generation:.4g} generation tokens/s is not finite")
    return ModelRate(model, RateStatus.OK, prompt, generation, gauges["waiting"], gauges["running"],
                     gauges["kv_usage"], read.span, read.resets, **_histogram_fields(read.hists),
                     aborted_per_s=math.fsum(read.aborts) if read.aborts else None)


def _went_back(last: _Last, s: SeriesSample) -> str:
    """Which counter went back, from what to what."""
    parts = [f"{name} went back from {old:.17g} to {new:.17g}"
             for name, old, new in (("prompt tokens", last.prompt, s.prompt_tokens),
                                    ("generation tokens", last.generation, s.generation_tokens)) if new < old]
    return ", ".join(parts)
