"""The risk a live fleet runs, observed as ``atoll/Fleet-v3`` observes it, for a learned ``-v4`` policy.

A policy trained on the charged world reads, beside the closed-loop signals, what its re-plans
risk (:data:`atoll.envs.observation.MODEL_FEATURES` / ``FLEET_FEATURES``). Live, each comes from
what a cluster can tell:

Per model, from the servers' signals after the plausibility gates (:mod:`atoll.control.plausibility`):

- ``queue_growth``: (requests waiting now - at the last tick) / (waiting + running) now, clipped to
  [-1, 1]. A held gauge gives 0 and is not the next tick's base; the first tick after a start
  sees no growth (as the arrivals estimate, :mod:`atoll.control.arrivals`).
- ``latency_miss``: the share of the interval's requests over a latency budget. From the TTFT
  histogram's bucket increases, the share above the TTFT budget (linear within the bucket that
  holds the budget, as Prometheus' ``histogram_quantile`` reads buckets); vLLM's inter-token
  histogram counts tokens, not requests, so its share above the inter-token budget is a token
  share. The larger of the two is used: a lower bound on the requests over either budget (the
  simulator counts a request once over both). No histogram: 0, as for a model without requests.
- ``spread`` and ``ondemand_share``: from the delivered plan, by the simulator's own function
  (:meth:`atoll.envs.fleet_model.FleetModel.risk_exposure`).

Per GPU type, over the last hour (:data:`atoll.envs.observation.RISK_WINDOW` steps of 5 minutes):

- ``preempted``: nodes preempted / (those + nodes the delivered plan holds now);
- ``refused``: nodes refused (a failed acquisition) / nodes the controller's deliveries requested.

vLLM exports neither, so they come from a **pool event log** (:class:`PoolEventLog`): JSON Lines,
one event per line, appended by whatever watches the cluster (a spot interruption handler,
Karpenter's ``SpotInterrupted`` / ``InsufficientCapacityError`` events, a cloud's preemption
notices)::

    {"time": 1764393600.0, "event": "preempted", "config": "4xL40S", "nodes": 1, "region": "aws:us-east-2"}
    {"time": 1764393900.0, "event": "refused", "config": "1xH100", "nodes": 2}

``time`` is on the controller's clock (Unix seconds, or the replay's trace seconds), ``config`` a
node config of the fleet, ``region`` optional. The log's own gates, like the servers': a line
that does not parse, names an unknown config, or has a negative or non-integer node count is
ignored and named in the tick's report; an event in the future (more than
:data:`FUTURE_TOLERANCE_S`) is held; preemptions beyond the nodes of the type the plan holds, and
refusals beyond the nodes requested in the window, are held (the type's share stays at what the
plausible events give) and reported. Nothing is dropped without a line in the report.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from atoll.envs.config import FleetConfig
from atoll.envs.observation import RISK_WINDOW
from atoll.envs.signals import risk_shares
from atoll.solvers.problem import gpu_type_of

WINDOW_S = RISK_WINDOW * FleetConfig.step_s  # the simulator's window: 12 steps of 5 minutes
FUTURE_TOLERANCE_S = 60.0  # clocks of the watcher and the controller may differ this much
EVENTS = ("preempted", "refused")
MAX_REPORTED = 20  # lines named per tick (the count is always given)


@dataclass(frozen=True)
class PoolEvent:
    """One line of the pool event log: ``nodes`` nodes of node config ``config`` preempted or
    refused (``event``) at ``time_s``, in ``region`` where the watcher knows it."""

    time_s: float
    event: str
    config: str
    nodes: int
    region: str | None = None

    def __post_init__(self) -> None:
        owner = "PoolEvent"
        if isinstance(self.time_s, bool) or not isinstance(self.time_s, int | float) \
                or not math.isfinite(self.time_s):
            raise ValueError(f"{owner}: field 'time' must be a finite number of seconds, got {self.time_s!r}")
        if self.event not in EVENTS:
            raise ValueError(f"{owner}: field 'event' must be one of {', '.join(EVENTS)}, got {self.event!r}")
        if isinstance(self.nodes, bool) or not isinstance(self.nodes, int) or self.nodes < 0:
            raise ValueError(f"{owner}: field 'nodes' must be an integer >= 0, got {self.nodes!r}")
        if not isinstance(self.config, str) or not self.config:
            raise ValueError(f"{owner}: field 'config' must be a node config such as '4xL40S', "
                             f"got {self.config!r}")

    @classmethod
    def from_json(cls, doc: Any) -> PoolEvent:
        if not isinstance(doc, Mapping):
            raise ValueError(f"an event must be a JSON object, got {doc!r:.80}")
        missing = [k for k in ("time", "event", "config", "nodes") if k not in doc]
        if missing:
            raise ValueError(f"an event needs fields time, event, config and nodes; "
                             f"missing {', '.join(missing)}")
        region = doc.get("region")
        return cls(doc["time"], doc["event"], doc["config"], doc["nodes"],
                   None if region is None else str(region))


@dataclass
class PoolEventLog:
    """A pool event log read as it grows: each :meth:`read` parses the lines appended since the
    last one (the whole file again when it was replaced or truncated) and returns the events of
    the window ending at ``now_s``, with the lines ignored and why."""

    path: Path
    configs: frozenset[str]
    _offset: int = 0
    _inode: int | None = None
    _events: list[PoolEvent] = field(default_factory=list)
    _line: int = 0

    def __post_init__(self) -> None:
        self.path = Path(self.path)
        if not self.path.is_file():
            raise FileNotFoundError(f"pool event log {self.path}: no such file; create it empty (a "
                                    f"fleet that has seen no preemption) and let the cluster's watcher "
                                    f"append to it")

    def read(self, now_s: float, window_s: float = WINDOW_S) -> tuple[list[PoolEvent], list[str]]:
        """(the events of (now - window, now + tolerance], the lines ignored this read and why).
        An unreadable file is an OSError for the caller to report."""
        stat = os.stat(self.path)
        if stat.st_ino != self._inode or stat.st_size < self._offset:  # replaced or truncated
            self._offset, self._events, self._line, self._inode = 0, [], 0, stat.st_ino
        ignored: list[str] = []
        with open(self.path, "rb") as fh:
            fh.seek(self._offset)
            data = fh.read()
        end = data.rfind(b"\n") + 1  # a line still being written is read next time, whole
        for raw in data[:end].splitlines():
            self._line += 1
            text = raw.decode("utf-8", errors="replace").strip()
            if not text:
                continue
            try:
                event = PoolEvent.from_json(json.loads(text))
            except (ValueError, TypeError) as exc:
                ignored.append(f"{self.path.name}:{self._line}: {exc}")
                continue
            if event.config not in self.configs:
                ignored.append(f"{self.path.name}:{self._line}: config {event.config!r} is not one of this "
                               f"fleet's ({', '.join(sorted(self.configs))})")
                continue
            self._events.append(event)
        self._offset += end
        # events older than the window never count again
        self._events = [e for e in self._events if e.time_s > now_s - window_s]
        return [e for e in self._events if e.time_s <= now_s + FUTURE_TOLERANCE_S], ignored


def pool_shares(events: Sequence[PoolEvent], gpu_types: Sequence[str], held: np.ndarray,
                requested: np.ndarray, now_s: float) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """([G] preempted share, [G] refused share, what was held and why) of the window's events,
    ``held`` [G] the nodes the delivered plan holds now and ``requested`` [G] the nodes its
    deliveries requested over the window (see the module docstring for the gates)."""
    index = {t: i for i, t in enumerate(gpu_types)}
    preempted, refused = np.zeros(len(gpu_types)), np.zeros(len(gpu_types))
    held_out: list[str] = []
    for e in events:
        if e.time_s > now_s + FUTURE_TOLERANCE_S:
            held_out.append(f"{e.event} {e.nodes} x {e.config} at {e.time_s:.0f} s is in the future "
                            f"(now {now_s:.0f} s)")
            continue
        target = preempted if e.event == "preempted" else refused
        target[index[gpu_type_of(e.config)]] += e.nodes
    for g, name in enumerate(gpu_types):
        if preempted[g] > held[g]:
            held_out.append(f"{preempted[g]:g} {name} nodes preempted in the last hour, but the plan holds "
                            f"{held[g]:g}")
            preempted[g] = held[g]
        if refused[g] > requested[g]:
            held_out.append(f"{refused[g]:g} {name} nodes refused in the last hour, but "
                            f"{requested[g]:g} were requested")
            refused[g] = requested[g]
    pre, fail = risk_shares(preempted, held, refused, requested)
    return pre, fail, held_out


def share_over(buckets: Sequence[tuple[float, float]] | None, budget_s: float) -> float:
    """The share of a histogram's observations above ``budget_s``, from its cumulative ``(le,
    count)`` buckets (the ``+Inf`` one last), linear within the bucket holding the budget; 0 with
    no buckets or no observations."""
    if not buckets:
        return 0.0
    total = buckets[-1][1]
    if total <= 0:
        return 0.0
    below, lo = 0.0, 0.0
    for le, count in buckets:
        if le >= budget_s:
            if math.isinf(le):
                at = below  # nothing is known past the last finite edge: counted over
            else:
                at = below + (count - below) * (budget_s - lo) / max(le - lo, 1e-12)
            return float(min(max(1.0 - at / total, 0.0), 1.0))
        below, lo = count, le
    return float(min(max(1.0 - below / total, 0.0), 1.0))


@dataclass
class QueueGrowth:
    """Each model's last plausible waiting count, the base of the next tick's growth."""

    last: dict[str, float] = field(default_factory=dict)

    def update(self, model: str, waiting: float | None, running: float | None) -> float:
        if waiting is None:  # held, or not exported: no growth seen, the base stays
            return 0.0
        total = waiting + (running or 0.0)
        before = self.last.get(model)
        self.last[model] = waiting
        if before is None or total <= 0:
            return 0.0
        return float(np.clip((waiting - before) / total, -1.0, 1.0))


def requested_by_type(window: Sequence[tuple[float, str, float]], gpu_types: Sequence[str],
                      now_s: float, window_s: float = WINDOW_S) -> np.ndarray:
    """[G] nodes requested over the window from the state's ``(time, GPU type, nodes)`` log."""
    out = np.zeros(len(gpu_types))
    index = {t: i for i, t in enumerate(gpu_types)}
    for t, gpu, n in window:
        # the ticks of the window before this one (this tick delivers after it observes), as the
        # simulator's window holds the 12 steps before its observation
        if now_s - window_s - 1e-6 <= t <= now_s + FUTURE_TOLERANCE_S and gpu in index:
            out[index[gpu]] += n
    return out


def report(events: Sequence[PoolEvent], ignored: Sequence[str], held: Sequence[str],
           error: str | None = None) -> dict[str, Any]:
    """The tick's account of the log: counts, and the lines ignored or held (at most
    :data:`MAX_REPORTED` each, with their totals)."""
    return {"ok": error is None, "error": error, "events_in_window": len(events),
            "ignored": list(ignored[:MAX_REPORTED]), "ignored_count": len(ignored),
            "held": list(held[:MAX_REPORTED]), "held_count": len(held)}
