"""The controller with a co-located model: planned, floored, counted and delivered as one replica
serving both phases, and rendered as plain vLLM behind the model's entry Service."""

from __future__ import annotations

from pathlib import Path

from control_helpers import FakeClock
from live_harness import INPUT, OUTPUT, ScriptedServers

from atoll.control.controller import Controller, ControllerSettings
from atoll.control.guard_rails import below_floor, service_counts
from atoll.control.k8s.render import ENTRY_POD_LABEL, K8sOptions, render_manifests
from atoll.control.live_fleet import LiveFleet
from atoll.control.plans import PlanRecord
from atoll.control.sinks import JsonDirSink
from atoll.envs.fleet import FleetState
from atoll.envs.policies import make_policy
from atoll.envs.vocabulary import parse_policy
from atoll.solvers.problem import Allocation
from atoll.solvers.types import Phase, Service, Stage, Template

USE2 = "aws:us-east-2"
MODELS = ("Phi-4-14B", "GPT-OSS-20B")
LAYERS = {"Phi-4-14B": 40, "GPT-OSS-20B": 24}
# Phi-4 may run co-located on one 1xL40S ($ of one node) instead of a prefill and a decode replica;
# GPT-OSS has only a replica per phase
BOTH = Template(Service("Phi-4-14B", Phase.COLOCATED), USE2, (("1xL40S", 1),), (Stage(40, ("1xL40S",)),),
                1500.0, 150.0)


def _templates() -> tuple[Template, ...]:
    out = [BOTH]
    for m in MODELS:
        out.append(Template(Service(m, Phase.PREFILL), USE2, (("1xL40S", 1),),
                            (Stage(LAYERS[m], ("1xL40S",)),), 800.0))
        out.append(Template(Service(m, Phase.DECODE), USE2, (("1xL4", 1),), (Stage(LAYERS[m], ("1xL4",)),),
                            200.0))
    return tuple(out)


def test_a_colocated_model_is_planned_floored_and_delivered(tmp_path: Path) -> None:
    fleet = LiveFleet("core", models=MODELS, templates=_templates(), request_shapes=[(INPUT, OUTPUT)] * 2)
    clock = FakeClock(10 * 86400.0)
    source = ScriptedServers(clock, {m: 10.0 for m in MODELS})  # 1000 prompt, 100 generated tokens/s
    controller = Controller(fleet, source, make_policy(parse_policy("fixed:1"), 2),  # type: ignore[arg-type]
                            JsonDirSink(tmp_path / "plans"), tmp_path / "state",
                            settings=ControllerSettings(interval_s=300.0), clock=clock, sleep=lambda s: None)
    for _ in range(2):
        report = controller.tick()
        source.advance(300.0)
    plan = controller.state.running
    assert plan.get(BOTH.key) == 1  # one co-located replica covers 1,100 and 110 tokens/s
    assert not any(k.startswith("Phi-4-14B/prefill") or k.startswith("Phi-4-14B/decode") for k in plan)
    cap = fleet.model.capacity(FleetState(running=fleet.known(plan)), 0.0)[1]
    assert cap[0].tolist() == [1500.0, 150.0]
    # the floor of one instance per phase holds with the one replica serving both
    assert service_counts(fleet, plan)[0].tolist() == [1, 1] and below_floor(fleet, plan) == {}
    assert report.plan_changed  # the second tick plans (the first warms up)
    adds = {(d["model"], d["phase"]): d["change"] for d in report.diff}
    assert adds[("Phi-4-14B", "colocated")] == 1 and ("Phi-4-14B", "prefill") not in adds
    record = PlanRecord.from_allocation(1, 0.0, Allocation.of(plan), None, fleet.templates, {}, "test")
    docs = render_manifests(record, K8sOptions(model_sources={"Phi-4-14B": "microsoft/phi-4",
                                                              "GPT-OSS-20B": "openai/gpt-oss-20b"}))
    phi = [d for d in docs if d["kind"] == "Deployment"
           and d["spec"]["template"]["metadata"]["labels"].get("atoll.io/phase") == "colocated"]
    assert len(phi) == 1 and phi[0]["spec"]["replicas"] == 1
    assert phi[0]["spec"]["template"]["metadata"]["labels"][ENTRY_POD_LABEL] == "true"
    assert "--kv-transfer-config" not in phi[0]["spec"]["template"]["spec"]["containers"][0]["command"][2]
