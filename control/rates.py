"""Token rates per model from successive :class:`~atoll.control.metrics.MetricsSnapshot` reads.

Pure logic: time comes only from the snapshots (their replicas' sample times), never from a
clock, so tests script snapshots and times freely.

Rules, per replica series of a model (then summed over the model's replicas):
- rate = increase / (this sample time - the previous sample time of that replica);
- counter reset (a value below the previous one: the replica restarted) -> the new value is
  the increase since the reset, as Prometheus' ``rate()`` does;
- a replica seen for the first time (or whose sample time went backwards) has no rate yet:
  the model is ``warming_up`` for one read;
- a replica with no new sample since the last read (the tick came before the next scrape)
  keeps its last rate;
- a replica that disappeared is dropped (scaled down or gone: its tokens are no longer served).

A model absent from a read is ``missing``; one whose read has a NaN or a missing series is
``invalid``. Neither gets a rate (``None``, never 0: a zero would let the planner scale the
model down), and neither moves the model's baseline, so the next good read rates the whole
gap. Expected models are those given at construction plus every model seen so far.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from atoll.control.metrics import MetricsSnapshot, ModelMetrics, SeriesSample


class RateStatus(enum.StrEnum):
    OK = "ok"
    WARMING_UP = "warming_up"
    MISSING = "missing"
    INVALID = "invalid"


@dataclass(frozen=True)
class ModelRate:
    """One model's rates over the last interval; rates are ``None`` unless ``status`` is ok.

    prompt/generation rates in tokens/s; waiting/running in requests (summed over replicas);
    kv_usage a fraction in [0, 1]; interval_s the longest replica interval the rate covers;
    resets the counter resets seen in it; reason says why a model has no rate.
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

    def __post_init__(self) -> None:
        owner = f"ModelRate {self.model!r}"
        object.__setattr__(self, "status", RateStatus(self.status))
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
                "resets": self.resets, "reason": self.reason}


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


def _increase(previous: float, current: float) -> tuple[float, int]:
    """Counter increase between two samples, and 1 if the counter was reset in between."""
    if current >= previous:
        return current - previous, 0
    return current, 1


def _gauge(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


class RateTracker:
    """Successive snapshots in, per-model rates out (see the module docstring for the rules).

    ``baseline`` (a snapshot of each model's last good replica samples) is what to persist;
    pass it back as ``baseline=`` after a restart and the first read already yields rates.
    """

    def __init__(self, models: Iterable[str] = (), baseline: MetricsSnapshot | None = None) -> None:
        self._expected: set[str] = set(models)
        self._series: dict[str, dict[str, _Last]] = {}
        self._time: float | None = None
        if baseline is not None:
            self._time = baseline.time_s
            for model, mm in baseline.models.items():
                self._expected.add(model)
                self._series[model] = {
                    s.series: _Last(s.time_s, s.prompt_tokens, s.generation_tokens) for s in mm.series
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
        models = {m: ModelMetrics(tuple(SeriesSample(rid, last.time_s, last.prompt, last.generation)
                                        for rid, last in sorted(reps.items())), None, None)
                  for m, reps in sorted(self._series.items())}
        return MetricsSnapshot(self._time if self._time is not None else 0.0, models, "baseline")

    def update(self, snapshot: MetricsSnapshot) -> RateReport:
        out: dict[str, ModelRate] = {}
        for model in sorted(self._expected | set(snapshot.models)):
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
                out[model] = self._rate(model, mm)
        self._time = snapshot.time_s
        return RateReport(snapshot.time_s, out)

    def _rate(self, model: str, mm: ModelMetrics) -> ModelRate:
        previous = self._series.get(model, {})
        current: dict[str, _Last] = {}
        prompt = generation = 0.0
        resets = 0
        span: float | None = None
        warming: list[str] = []
        for s in mm.series:
            last = previous.get(s.series)
            if last is None or s.time_s < last.time_s:
                current[s.series] = _Last(s.time_s, s.prompt_tokens, s.generation_tokens)
                warming.append(s.series)
                continue
            if s.time_s == last.time_s:
                # no scrape since the last read: the replica's last rate still stands
                current[s.series] = last
                if last.prompt_rate is None or last.generation_rate is None:
                    warming.append(s.series)
                    continue
                p, g = last.prompt_rate, last.generation_rate
            else:
                dt = s.time_s - last.time_s
                dp, rp = _increase(last.prompt, s.prompt_tokens)
                dg, rg = _increase(last.generation, s.generation_tokens)
                resets += rp + rg
                p, g = dp / dt, dg / dt
                current[s.series] = _Last(s.time_s, s.prompt_tokens, s.generation_tokens, p, g)
                span = dt if span is None else max(span, dt)
            prompt += p
            generation += g
        self._series[model] = current
        waiting, running, kv = _gauge(mm.waiting), _gauge(mm.running), _gauge(mm.kv_usage)
        if warming:
            return ModelRate(model, RateStatus.WARMING_UP, waiting=waiting, running=running, kv_usage=kv,
                             resets=resets,
                             reason=f"first sample of replica(s) {', '.join(map(repr, warming))}; "
                                    f"a rate needs the next read")
        return ModelRate(model, RateStatus.OK, prompt, generation, waiting, running, kv, span, resets)
