"""A controller process for the make-before-break kill test (run as a script by
test_make_before_break.py): one model whose prefill moves from a small template to a big one
when its demand jumps, ticks on a clock derived from the persisted tick count, a sink that logs
every delivery. ``phase1``: stop (sleep until killed) once the additions are delivered;
``final``: tick until the removal phase is delivered, then exit."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from atoll.control.controller import Controller, ControllerSettings
from atoll.control.live_fleet import LiveFleet
from atoll.control.metrics import GENERATION, PROMPT, RUNNING, WAITING, MetricsSnapshot, assemble
from atoll.control.plans import PlanRecord, SinkResult
from atoll.control.sinks import JsonDirSink
from atoll.envs.policies import make_policy
from atoll.envs.vocabulary import parse_policy
from atoll.solvers.types import Phase, Service, Stage, Template

MODEL = "Phi-4-14B"
USE2 = "aws:us-east-2"
T0, STEP, SWITCH = 10 * 86400.0, 300.0, 10 * 86400.0 + 900.0
LOW, HIGH = 2.5, 7.0  # req/s: 275 prefill tokens/s planned -> one small; 770 -> one big (< 3 small)
SMALL = Template(Service(MODEL, Phase.PREFILL), USE2, (("1xL4", 1),), (Stage(40, ("1xL4",)),), 300.0)
BIG = Template(Service(MODEL, Phase.PREFILL), USE2, (("1xL40S", 1),), (Stage(40, ("1xL40S",)),), 800.0)
DECODE = Template(Service(MODEL, Phase.DECODE), USE2, (("1xL4", 1),), (Stage(40, ("1xL4",)),), 200.0)


class Clock:
    now = T0

    def __call__(self) -> float:
        return self.now


class StepSource:
    url = "scripted://step"

    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    def read(self) -> MetricsSnapshot:
        t = self.clock()
        requests = LOW * min(t, SWITCH) + HIGH * max(0.0, t - SWITCH)
        raw = [(MODEL, "r0", PROMPT, requests * 100.0), (MODEL, "r0", GENERATION, requests * 10.0),
               (MODEL, "r0", WAITING, 0.0), (MODEL, "r0", RUNNING, 1.0)]
        return assemble(raw, {}, t, self.url)


class LoggingSink:
    """Writes plans as json:DIR does and appends each delivery's sequence to a log (fsynced)."""

    def __init__(self, directory: Path, log: Path) -> None:
        self.inner, self.log, self.name = JsonDirSink(directory), log, "logging"

    def write(self, record: PlanRecord) -> SinkResult:
        result = self.inner.write(record)
        with open(self.log, "a", encoding="utf-8") as f:
            f.write(json.dumps({"sequence": record.sequence, "plan": record.plan}) + "\n")
            f.flush()
            os.fsync(f.fileno())
        return result


def main(state_dir: str, sink_dir: str, log: str, mode: str) -> None:
    fleet = LiveFleet("core", models=(MODEL,), templates=(SMALL, BIG, DECODE),
                      request_shapes=[(100.0, 10.0)])
    clock = Clock()
    sink = LoggingSink(Path(sink_dir), Path(log))
    rule = make_policy(parse_policy("fixed:1"), 1)
    controller = Controller(fleet, StepSource(clock), rule, sink, state_dir,
                            settings=ControllerSettings(interval_s=STEP), clock=clock,
                            sleep=lambda s: None)
    for _ in range(20):
        clock.now = T0 + controller.state.tick * STEP
        controller.tick()
        state = controller.state
        print(json.dumps({"tick": state.tick, "final": state.final is not None,
                          "pending": state.pending is not None}), flush=True)
        if mode == "phase1" and state.final is not None and state.pending is None:
            print("PHASE1", flush=True)
            time.sleep(600)  # the test kills the process here, between the two phases
        if mode == "final" and state.final is None and state.tick > 5:
            return
    raise SystemExit("the removal phase never came")


if __name__ == "__main__":
    main(*sys.argv[1:5])
