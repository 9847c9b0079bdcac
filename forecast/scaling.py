"""Explicit scaling of a demand series: only when asked, and said when applied.

A scale spec is text, so that a command line (``--scale mean:10``), a workload name and a
setting can all carry it:

- ``mean:R`` — multiply requests/s so that their mean over the whole series is R req/s (the
  shape and the request lengths are kept), as the Coral paper does with 10 or 25 req/s;
- ``factor:F`` — multiply requests/s by F;
- ``none`` — keep the rates as recorded (overrides a default scaling).

A workload name may carry its own spec after a final ``@``: ``csv:requests.csv#phi-4@mean:10``,
``servegen:m-large@none``. :func:`with_scale` adds one spec to every name of a comma-separated
list that has none (what a ``--scale`` option does). Every scaling that is applied logs one line
on the ``atoll`` logger (``atoll.forecast.scaling``) naming the series, the spec and the factor.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace

import numpy as np

from atoll.forecast.workloads import DemandSeries, WorkloadError

log = logging.getLogger(__name__)

SCALE_KINDS = ("mean", "factor", "none")
SCALE_HELP = "mean:R (scale to a mean of R req/s), factor:F (multiply the rate by F) or none"


@dataclass(frozen=True)
class Scale:
    """A parsed scale spec; ``value`` is the target mean (``mean``) or the factor (``factor``)."""

    kind: str
    value: float = 1.0

    def __post_init__(self) -> None:
        if self.kind not in SCALE_KINDS:
            raise WorkloadError(f"scale kind {self.kind!r} is unknown; use {SCALE_HELP}")
        if self.kind != "none" and not (math.isfinite(self.value) and self.value > 0):
            raise WorkloadError(f"scale {self.kind}:{self.value!r} must be a finite number > 0; "
                                f"use {SCALE_HELP}")

    def __str__(self) -> str:
        return "none" if self.kind == "none" else f"{self.kind}:{self.value:g}"

    def factor_for(self, mean_req_per_s: float) -> float:
        """The factor this spec applies to a series whose mean is ``mean_req_per_s``."""
        if self.kind == "none":
            return 1.0
        if self.kind == "factor":
            return self.value
        if not mean_req_per_s > 0:
            raise WorkloadError(f"a series with no requests cannot be scaled to a mean of "
                                f"{self.value:g} req/s (scale {self})")
        return self.value / mean_req_per_s


def parse_scale(text: str | Scale, *, where: str = "scale") -> Scale:
    """``mean:R``, ``factor:F`` or ``none`` -> :class:`Scale`; errors name ``where`` and the fix."""
    if isinstance(text, Scale):
        return text
    s = str(text).strip()
    if s == "none":
        return Scale("none")
    kind, sep, value = s.partition(":")
    kind = kind.strip()
    if not sep or kind not in ("mean", "factor"):
        raise WorkloadError(f"{where} {text!r} is not a scale spec; use {SCALE_HELP}")
    try:
        v = float(value)
    except ValueError:
        raise WorkloadError(f"{where} {text!r}: {value.strip()!r} is not a number; "
                            f"use {SCALE_HELP}") from None
    try:
        return Scale(kind, v)
    except WorkloadError as exc:
        raise WorkloadError(f"{where}: {exc}") from None


def _is_spec(tail: str) -> bool:
    t = tail.strip()
    return t == "none" or t.startswith(("mean:", "factor:"))


def split_scale(name: str) -> tuple[str, Scale | None]:
    """``"csv:log.csv#a@mean:10"`` -> ``("csv:log.csv#a", Scale("mean", 10))``; a name without
    a spec after its last ``@`` (or whose tail is no spec, e.g. a path with an ``@``) is returned
    whole with None."""
    head, sep, tail = name.rpartition("@")
    if not sep or not _is_spec(tail):
        return name, None
    return head, parse_scale(tail, where=f"workload {name!r}: scale")


def with_scale(workloads: str, scale: str | Scale | None) -> str:
    """Every comma-separated workload name that carries no scale spec gets ``@<scale>`` (a name
    with its own spec keeps it): what a ``--scale`` option passes on in the workload setting."""
    if scale is None:
        return workloads
    spec = parse_scale(scale, where="--scale")
    names = [w.strip() for w in workloads.split(",") if w.strip()]
    return ",".join(w if split_scale(w)[1] is not None else f"{w}@{spec}" for w in names)


def apply_scale(series: DemandSeries, scale: Scale | str | None, *, source: str | None = None,
                level: int = logging.WARNING, mean: float | None = None) -> DemandSeries:
    """``series`` with requests/s scaled as ``scale`` says (None or ``none``: unchanged, nothing
    logged); one line on the ``atoll`` logger at ``level`` says what was applied. ``mean`` is the
    series' mean rate a ``mean:R`` spec scales from when it is not the plain mean over all
    steps (a request log's mean with its gaps left out, said in the line)."""
    if scale is None:
        return series
    spec = parse_scale(scale)
    if spec.kind == "none":
        return series
    plain = float(np.mean(series.requests_per_s)) if len(series) else 0.0
    given = mean is not None and spec.kind == "mean"
    base = float(mean) if given else plain  # type: ignore[arg-type]
    factor = spec.factor_for(base)
    out = replace(series, requests_per_s=series.requests_per_s * factor)
    log.log(level, "%s: scaled by %s: requests/s x%.4g, mean %.4g -> %.4g req/s%s",
            source or series.name, spec, factor, base, base * factor,
            " (over the steps with data: gaps left out)" if given and abs(base - plain) > 1e-12 * max(base, 1)
            else "")
    return out
