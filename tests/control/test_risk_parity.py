"""A learned ``atoll/Fleet-v4`` policy runs live as in the simulator: one trace through FleetEnv
(the closed loop's servers, the observation of risk, the risk action) and through the live
controller, whose scripted vLLM exports what the env's servers reported (gauges, latency
histograms) and whose pool event log is empty as the ample market's. The observations, the
decisions with their risk presets and the fleets are the same at every step."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from control_helpers import FakeClock
from live_harness import INPUT, MODELS, OUTPUT
from test_observation_parity import DAY, STEP, TraceSource, library, norm
from test_observation_parity import trace as daily_trace

from atoll.control.controller import Controller, ControllerSettings
from atoll.control.live_fleet import LiveFleet
from atoll.control.metrics import GENERATION, ITL, PROMPT, RUNNING, TTFT, WAITING, MetricsSnapshot, assemble
from atoll.control.metrics import bucket_name as bucket
from atoll.control.risk_signals import PoolEventLog
from atoll.control.sinks import JsonDirSink
from atoll.control.state import ControllerState, HistoryPoint, save_state
from atoll.envs.config import FleetConfig
from atoll.envs.fleet import FleetState
from atoll.envs.fleet_env import FleetEnv
from atoll.envs.servers import ServerReport
from atoll.envs.vocabulary import parse_policy
from atoll.forecast.workloads import DemandSeries
from atoll.solvers.problem import Risk
from atoll.training.policy_file import FilePolicy

STEPS = 288  # a whole replayed day


class ServerSource(TraceSource):
    """The trace's token counters, plus what the env's servers reported for each finished step:
    the waiting and running gauges of the last one, and TTFT / inter-token histograms whose sums
    and counts give the env's mean latencies and whose TTFT bucket at the budget holds the
    share of requests the env counted on time (every token within the inter-token budget)."""

    def __init__(self, clock: FakeClock, rates: np.ndarray, budgets: list[tuple[float, float]]) -> None:
        super().__init__(clock, rates)
        self.budgets = budgets
        self.reports: dict[int, ServerReport] = {}  # absolute step -> the env's report of it

    def snapshot(self, t: float) -> MetricsSnapshot:
        steps = round(t / STEP)
        done = [g for g in sorted(self.reports) if g < steps]
        raw = []
        for i, (m, (p, g)) in enumerate(self.counters(t).items()):
            last = self.reports[done[-1]] if done else None
            raw += [(m, "r0", PROMPT, p), (m, "r0", GENERATION, g),
                    (m, "r0", WAITING, float(last.waiting[i]) if last else 0.0),
                    (m, "r0", RUNNING, float(last.running[i]) if last else 1.0)]
            # exported from the start, empty until a step finishes (as vLLM's histograms are)
            n = {k: self.rates[i, k] * STEP for k in done}  # requests of each step
            ttft_sum = math.fsum(self.reports[k].ttft_mean_s[i] * n[k] for k in done)
            itl_sum = math.fsum(self.reports[k].itl_mean_s[i] * n[k] for k in done)
            count = math.fsum(n.values())
            on_time = math.fsum(self.reports[k].slo_share[i] * n[k] for k in done)
            pre, dec = self.budgets[i]
            raw += [(m, "r0", f"{TTFT}_sum", ttft_sum), (m, "r0", f"{TTFT}_count", count),
                    (m, "r0", bucket(f"{TTFT}_bucket", repr(pre)), on_time),
                    (m, "r0", bucket(f"{TTFT}_bucket", "+Inf"), count),
                    (m, "r0", f"{ITL}_sum", itl_sum), (m, "r0", f"{ITL}_count", count),
                    (m, "r0", bucket(f"{ITL}_bucket", repr(dec)), count),
                    (m, "r0", bucket(f"{ITL}_bucket", "+Inf"), count)]
        return assemble(raw, {}, t, self.url)


@pytest.fixture(scope="module")
def risk_policy(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, FleetConfig]:
    """An untrained (seeded) PPO policy on the Fleet-v4 env, written as a policy file: what the
    controller must feed and decode is the same whatever the weights."""
    from stable_baselines3 import PPO

    from atoll.training.policy_file import write_policy_file
    from atoll.training.train import TrainSettings
    from atoll.training.train_tracking import policy_card

    config = env_config()
    env = FleetEnv(config)
    model = PPO("MlpPolicy", env, seed=0, device="cpu", verbose=0)
    size = int(env.observation_space.shape[0])  # type: ignore[index]
    card = policy_card(config, TrainSettings(timesteps=1), observation_size=size, steps=0, selected="last",
                       validation_score=None, command="(test)", created="2026-01-01T00:00:00+00:00",
                       digest="0" * 16)
    return write_policy_file(tmp_path_factory.mktemp("v4") / "policy", card, model=model), config


def trace() -> np.ndarray:
    """[models, 6 days of 5-min steps] request rates: a slow daily swing with a little noise, seeded.
    The servers must keep up for the two sides to see the same demand: at its latency at capacity
    a phase counts as saturated, and the controller plans it from estimated arrivals
    (:mod:`atoll.control.arrivals`; served + queue growth) where the simulator knows the demand.
    Hence also the configured risk, headroom 0.5 (the policy's other preset is 0.7)."""
    return daily_trace(swing=0.3, noise=0.03)


def env_config() -> FleetConfig:
    rates = trace()
    shapes = ((INPUT, OUTPUT),) * len(MODELS)
    demand = tuple(DemandSeries(f"s{i}", STEP, rates[i], np.full(rates.shape[1], INPUT),
                                np.full(rates.shape[1], OUTPUT)) for i in range(len(MODELS)))
    return FleetConfig(scenario="core", models=MODELS, templates=library(), demand=demand,
                       request_shapes=shapes, forecaster="ets", availability="ample", prices="on-demand",
                       days=(4, 6),
                       observation="v3", action="risk", risk=Risk.parse("h0.5"),
                       risk_menu=(Risk.parse("h0.7"),), correction=False)


def test_a_learned_fleet_v4_policy_sees_and_does_live_what_it_does_in_the_simulator(
        tmp_path: Path, risk_policy: tuple[Path, FleetConfig]) -> None:
    from atoll.training.evaluate import resolve_policy

    folder, config = risk_policy
    env = FleetEnv(config)
    env_policy = resolve_policy(parse_policy(f"learned:file:{folder}"), len(MODELS))
    assert isinstance(env_policy, FilePolicy)
    assert (env_policy.observation_size,) == env.observation_space.shape
    obs, _ = env.reset(seed=0, options={"day": DAY})
    g0 = (DAY - 1) * 288
    rates = trace()
    fleet = LiveFleet("core", models=MODELS, templates=library(), request_shapes=config.request_shapes,
                      solver_time_limit=env.config.solver_time_limit)
    clock = FakeClock(g0 * STEP)
    pre, dec = env._latency  # type: ignore[misc]  # the env's budgets: the histograms' bucket edges
    source = ServerSource(clock, rates, [(p.budget_s, d.budget_s) for p, d in zip(pre, dec, strict=True)])
    history = {m: tuple(HistoryPoint((g + 1) * STEP, rates[i, g] * INPUT, rates[i, g] * OUTPUT)
                        for g in range(g0 - 1)) for i, m in enumerate(MODELS)}
    running = dict(env.state.running)
    scale = float(fleet.model.cost(FleetState(running=dict(running)), 3600.0).sum())
    save_state(tmp_path / "state", ControllerState(running=running, history=history,
                                                   last_reoptimized=dict.fromkeys(MODELS, 0),
                                                   last_metrics=source.snapshot((g0 - 1) * STEP),
                                                   cost_scale_usd_h=scale))
    live_policy = resolve_policy(parse_policy(f"learned:file:{folder}"), len(MODELS))
    settings = ControllerSettings(interval_s=STEP, forecaster="ets", correction=False,
                                  action_levels=tuple(config.action_levels),
                                  risk_presets=tuple(live_policy.risk_presets))  # type: ignore[attr-defined]
    log = tmp_path / "pool-events.jsonl"
    log.write_text("")
    configs = frozenset(c for t in fleet.templates.values() for c, _ in t.node_use)
    controller = Controller(fleet, source, live_policy, JsonDirSink(tmp_path / "plans"),
                            tmp_path / "state", settings=settings, clock=clock, sleep=lambda s: None,
                            events=PoolEventLog(log, configs))
    risky, replans, growth = 0, 0, 0.0
    for k in range(STEPS):
        action = env_policy.act(obs, {"step": k})
        report = controller.tick()
        assert report.metrics["ok"] and not report.decision.held, f"step {k}"
        np.testing.assert_allclose(controller.last_observation, obs, rtol=0, atol=1e-5,
                                   err_msg=f"observation differs at step {k}")
        want = {MODELS[i]: env.codec.decode(int(action[i])).label() for i in np.flatnonzero(action)}
        assert report.decision.reopt == want, f"step {k}"
        risky += sum("+h0.7" in label for label in want.values())
        assert report.metrics["risk"]["ok"] and report.metrics["risk"]["events_in_window"] == 0
        growth += sum(abs(v) for v in report.metrics["risk"]["queue_growth"].values())
        obs, _, _, _, info = env.step(action)
        source.reports[g0 + k] = env.last_report  # type: ignore[assignment]
        assert norm(controller.fleet_state(clock() + STEP)) == norm(env.state), f"fleet, step {k}"
        replans += int(report.plan_changed)
        clock.advance(STEP)
    # the policy's codes reached both the risk preset and the re-plans, and queues moved
    assert risky >= 1 and replans >= 1 and growth > 0

    # the log's events reach the observation, past its gates: a preemption of a held node counts,
    # a line that does not parse and one with an unknown config are named, 50 nodes are held
    held = FleetState(running=dict(controller.state.running)).nodes_held(fleet.templates)
    (_, config_held), _ = sorted(held.items())[0]
    now = clock()
    with log.open("a") as fh:
        fh.write(f'{{"time": {now - 60}, "event": "preempted", "config": "{config_held}", "nodes": 1}}\n')
        fh.write("not json\n")
        fh.write(f'{{"time": {now - 60}, "event": "preempted", "config": "9xB200", "nodes": 1}}\n')
        fh.write(f'{{"time": {now - 30}, "event": "refused", "config": "{config_held}", "nodes": 50}}\n')
    risk = controller.tick().metrics["risk"]
    gpu = next(g for g in fleet.gpu_types if config_held.endswith(g))
    assert risk["preempted_share"][gpu] > 0 and risk["events_in_window"] == 2
    assert risk["ignored_count"] == 2 and "9xB200" in risk["ignored"][1]
    assert risk["held_count"] == 1 and "refused" in risk["held"][0]
