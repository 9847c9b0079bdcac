"""The live controller's test bench, shared by the control tests: a two-model fleet (Phi-4-14B and
GPT-OSS-20B in one region, a prefill and a decode template each), scripted vLLM servers on a fake
clock, and a harness that ticks a controller against them."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from control_helpers import FakeClock

from atoll.control.controller import Controller, ControllerSettings, TickReport
from atoll.control.live_fleet import LiveFleet
from atoll.control.metrics import (
    GENERATION,
    PROMPT,
    RUNNING,
    WAITING,
    MetricsSnapshot,
    MetricsUnavailable,
    assemble,
)
from atoll.control.sinks import JsonDirSink
from atoll.envs.policies import make_policy
from atoll.envs.vocabulary import parse_policy
from atoll.solvers.types import Phase, Service, Stage, Template

USE2 = "aws:us-east-2"
MODELS = ("Phi-4-14B", "GPT-OSS-20B")
LAYERS = {"Phi-4-14B": 40, "GPT-OSS-20B": 24}
INPUT, OUTPUT = 100.0, 10.0  # tokens per request
PREFILL_TPS, DECODE_TPS = 800.0, 200.0  # tokens/s per instance


def templates() -> tuple[Template, ...]:
    """Per model a prefill template on a 1xL40S and a decode one on a 1xL4, in ``USE2``."""
    out = []
    for m in MODELS:
        out.append(Template(Service(m, Phase.PREFILL), USE2, (("1xL40S", 1),),
                            (Stage(LAYERS[m], ("1xL40S",)),), PREFILL_TPS))
        out.append(Template(Service(m, Phase.DECODE), USE2, (("1xL4", 1),), (Stage(LAYERS[m], ("1xL4",)),),
                            DECODE_TPS))
    return tuple(out)


def live_fleet(**kw: Any) -> LiveFleet:
    """The two models on :func:`templates`, every request ``INPUT`` + ``OUTPUT`` tokens; ``kw``
    goes to :class:`LiveFleet` (floors, ...)."""
    return LiveFleet("core", models=MODELS, templates=templates(), request_shapes=[(INPUT, OUTPUT)] * 2, **kw)


class ScriptedServers:
    """vLLM counters per model (one replica each) growing at scripted request rates on a fake
    clock, from ``start`` (prompt, generation tokens). What a test sets: ``down`` fails every
    read; ``faults[model]`` drops its series ("missing") or reads its prompt counter as NaN
    ("nan"); ``override[model]`` replaces its prompt counter for one read (a bad sample);
    ``instances`` (model -> planned instances; None: all serve) leaves a model without an
    instance without a server, so without series, as on a real cluster; ``extra`` names models
    outside the fleet that this read also shows."""

    url = "scripted://servers"

    def __init__(self, clock: FakeClock, rates: dict[str, float],
                 start: tuple[float, float] = (0.0, 0.0)) -> None:
        self.clock, self.rates = clock, dict(rates)
        self.counters = {m: list(start) for m in rates}
        self.down = False
        self.faults: dict[str, str] = {}
        self.override: dict[str, float] = {}
        self.instances: Mapping[str, int] | None = None
        self.extra: list[str] = []
        self.reads = 0

    def advance(self, seconds: float) -> None:
        for m, r in self.rates.items():
            self.counters[m][0] += r * INPUT * seconds
            self.counters[m][1] += r * OUTPUT * seconds
        self.clock.advance(seconds)

    def read(self) -> MetricsSnapshot:
        self.reads += 1
        if self.down:
            raise MetricsUnavailable(self.url, "connection refused")
        raw = []
        for m, (p, g) in self.counters.items():
            fault = self.faults.get(m)
            if fault == "missing" or (self.instances is not None and not self.instances.get(m)):
                continue  # no series: a scripted fault, or no server
            prompt = math.nan if fault == "nan" else self.override.pop(m, p)
            raw += [(m, "r0", PROMPT, prompt), (m, "r0", GENERATION, g),
                    (m, "r0", WAITING, 0.0), (m, "r0", RUNNING, 1.0)]
        for name in self.extra:
            raw += [(name, "r0", PROMPT, 1.0), (name, "r0", GENERATION, 1.0)]
        return assemble(raw, {}, self.clock(), self.url)


class Harness:
    """A controller on ``fleet`` reading :class:`ScriptedServers` (every model at 10 req/s unless
    ``rates`` says otherwise) with rule ``policy``, its state in ``tmp/state`` and its plans in
    ``sink`` (default a JSON folder ``tmp/plans``); a tick runs one and moves the servers and the
    clock on by ``interval`` seconds. ``settings`` go to :class:`ControllerSettings`; the
    controller's sleeps are recorded in ``sleeps``, never slept."""

    def __init__(self, fleet: LiveFleet, tmp: Path, rates: dict[str, float] | None = None, *,
                 interval: float = 300.0, policy: str = "fixed:1", sink: object | None = None,
                 **settings: Any) -> None:
        self.clock = FakeClock(10 * 86400.0)
        self.source = ScriptedServers(self.clock, rates or {m: 10.0 for m in MODELS}, start=(1e6, 1e5))
        self.sleeps: list[float] = []
        self.dir = tmp / "state"
        self.sink = sink or JsonDirSink(tmp / "plans")
        self.fleet, self.policy, self.interval = fleet, policy, interval
        self.settings = ControllerSettings(interval_s=interval, **settings)
        self.controller = self.new()

    def new(self) -> Controller:
        rule = make_policy(parse_policy(self.policy), len(MODELS))
        return Controller(self.fleet, self.source, rule, self.sink,  # type: ignore[arg-type]
                          self.dir, settings=self.settings, clock=self.clock, sleep=self.sleeps.append)

    def tick(self) -> TickReport:
        report = self.controller.tick()
        self.source.advance(self.interval)
        return report

    def per_model(self) -> dict[str, int]:
        """Model -> instances in the running plan."""
        out = dict.fromkeys(MODELS, 0)
        for key, n in self.controller.state.running.items():
            out[self.fleet.templates[key].service.model] += n
        return out

    def per_service(self, model: str) -> tuple[int, int]:
        """(prefill, decode) instances of ``model`` in the running plan."""
        counts = [0, 0]
        for key, n in self.controller.state.running.items():
            t = self.fleet.templates[key]
            if t.service.model == model:
                counts[0 if t.service.phase is Phase.PREFILL else 1] += n
        return counts[0], counts[1]
