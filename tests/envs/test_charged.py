"""What a cluster charges for a re-plan: sampled start-ups and the warm pool, zone-correlated
preemptions, spot acquisition that fails, scale-down that loses, and the observation of risk."""

from __future__ import annotations

import re
from collections.abc import Mapping

import gymnasium as gym
import numpy as np
import pytest

from atoll import envs
from atoll.envs.availability import SpotAvailability, SpotTrace
from atoll.envs.config import FleetConfig
from atoll.envs.fleet import BOOT_S, COMPILE_COLD_S, PULL_S, FleetState, draw_startup
from atoll.envs.fleet_env import FleetEnv
from atoll.envs.observation import POOL_FEATURES, RISK_FEATURES, feature_names, observation_size
from atoll.forecast.workloads import DemandSeries
from atoll.solvers.errors import InputError
from atoll.solvers.models import get_model
from atoll.solvers.problem import Allocation
from atoll.solvers.types import Phase, Service, Stage, Template

MODEL = "Phi-4-14B"
USE2 = "aws:us-east-2"
PREFILL = Template(Service(MODEL, Phase.PREFILL), USE2, (("1xL40S", 1),), (Stage(40, ("1xL40S",)),), 800.0)
DECODE = Template(Service(MODEL, Phase.DECODE), USE2, (("1xL4", 1),), (Stage(40, ("1xL4",)),), 20.0)
HALF = Template(Service(MODEL, Phase.PREFILL), USE2, (("1xL40S", 2),),
                (Stage(20, ("1xL40S",)), Stage(20, ("1xL40S",))), 1500.0)
TEMPLATES = {t.key: t for t in (PREFILL, DECODE, HALF)}


def series(rates: np.ndarray) -> DemandSeries:
    ones = np.ones(len(rates))
    return DemandSeries("synthetic", 300.0, rates, 2048 * ones, 28 * ones)


def tiny(**changes: object) -> FleetConfig:
    base: dict[str, object] = dict(scenario="core", models=(MODEL,), templates=(PREFILL, DECODE),
                                   demand=(series(np.full(6 * 288, 1.0)),), forecaster="naive",
                                   availability="ample", prices="on-demand", days=(4, 6))
    base.update(changes)
    return FleetConfig(**base)  # type: ignore[arg-type]


# ----- start-up as a distribution ------------------------------------------------------------

def test_a_new_node_pays_boot_pull_weights_and_a_cold_compile() -> None:
    model = get_model(MODEL)
    draws = [draw_startup(PREFILL, model, FleetState(), np.random.default_rng(s)) for s in range(200)]
    weights = 40 * model.layer_weight_bytes / 1e9  # seconds at 1 GB/s
    low = BOOT_S[1] + PULL_S[1] + COMPILE_COLD_S[1]
    assert min(draws) >= low
    assert np.median(draws) == pytest.approx(BOOT_S[0] + PULL_S[0] + weights + COMPILE_COLD_S[0], rel=0.15)
    assert np.std(draws) > 20.0  # a spread, not a constant


def test_start_up_grows_with_the_weights_a_node_holds() -> None:
    model = get_model(MODEL)
    whole = [draw_startup(PREFILL, model, FleetState(), np.random.default_rng(s)) for s in range(100)]
    big = get_model("Qwen3-32B")
    bigger = [draw_startup(Template(Service(big.name, Phase.PREFILL), USE2, (("1xH100", 1),),
                                    (Stage(big.layers, ("1xH100",)),), 1.0), big, FleetState(),
                           np.random.default_rng(s)) for s in range(100)]
    assert np.median(bigger) - np.median(whole) == pytest.approx(
        (big.layers * big.layer_weight_bytes - 40 * model.layer_weight_bytes) / 1e9, rel=0.35)


def test_a_free_node_of_the_same_model_starts_in_seconds_and_is_taken() -> None:
    model = get_model(MODEL)
    state = FleetState(warm_s=600.0)
    state.warm[(USE2, "1xL40S", MODEL)] = [[1.0, 300.0]]
    warm = draw_startup(PREFILL, model, state, np.random.default_rng(0))
    assert state.warm == {}  # taken
    cold = draw_startup(PREFILL, model, state, np.random.default_rng(0))  # none left: a new node
    assert warm < 40.0 < BOOT_S[1] + PULL_S[1] <= cold
    # a free node of another model: no boot, no pull, but weights from object storage and a cold compile
    state.warm[(USE2, "1xL40S", "GPT-OSS-20B")] = [[1.0, 300.0]]
    other = draw_startup(PREFILL, model, state, np.random.default_rng(0))
    assert warm < other < cold


def test_a_drained_node_joins_the_warm_pool_billed_and_a_drop_takes_it_first() -> None:
    state = FleetState(running={PREFILL.key: 2}, warm_s=600.0)
    state.apply_plan(Allocation.of({PREFILL.key: 1}), {PREFILL.key: 200.0}, 60.0)
    assert state.draining[PREFILL.key] == [[1.0, 60.0]]
    state.advance(300.0, TEMPLATES)
    assert state.warm_nodes() == {(USE2, "1xL40S"): 1}
    assert state.warm[(USE2, "1xL40S", MODEL)] == [[1.0, pytest.approx(600.0 - 240.0)]]
    assert state.nodes_held(TEMPLATES) == {(USE2, "1xL40S"): 2}
    lost = state.preempt({(USE2, "1xL40S"): 1}, TEMPLATES, np.random.default_rng(0))
    assert lost == {} and state.running == {PREFILL.key: 1} and state.warm == {}
    # without a warm pool the node leaves with its drain
    plain = FleetState(running={PREFILL.key: 2})
    plain.apply_plan(Allocation.of({PREFILL.key: 1}), {PREFILL.key: 200.0}, 60.0)
    plain.advance(300.0, TEMPLATES)
    assert plain.warm == {}


def test_the_env_bills_the_warm_pool_and_draws_start_ups_from_its_seed() -> None:
    def run(seed: int, startup: str) -> list[tuple[object, ...]]:
        rates = np.full(6 * 288, 1.0)
        rates[4 * 288 + 5] = rates[4 * 288 + 9] = 3.0  # up at step 3, down at 6, up again at 7
        env = FleetEnv(tiny(demand=(series(rates),), startup=startup))
        env.reset(seed=seed, options={"day": 5, "planning": "oracle"})
        out = []
        for _ in range(12):
            _, _, _, _, info = env.step(np.array([1]))
            out.append((info["total"]["cost_usd"], info["total"]["free_nodes"],
                        sorted((k, tuple(map(tuple, v))) for k, v in env.state.starting.items())))
        return out

    a, b, fixed = run(1, "sampled"), run(1, "sampled"), run(1, "fixed")
    assert a == b  # same seed, same start-ups
    assert a != run(2, "sampled")
    assert any(free for _, free, _ in a) and not any(free for _, free, _ in fixed)
    assert sum(c for c, _, _ in a) > sum(c for c, _, _ in fixed)  # free nodes are billed


# ----- correlated preemptions ----------------------------------------------------------------

def _trace() -> SpotTrace:
    values = tuple(int(v) for v in np.random.default_rng(3).integers(0, 17, size=200))
    return SpotTrace(values=values, gap_seconds=300.0, nodes=16, source="synthetic")


def test_zone_correlation_moves_one_gpu_type_of_a_region_together() -> None:
    base = {(USE2, "1xL4"): 16, (USE2, "4xL4"): 16, (USE2, "1xL40S"): 16}
    zone = SpotAvailability(base, {USE2: _trace()}, correlation="zone")
    free = SpotAvailability(base, {USE2: _trace()})
    rng_z, rng_f = np.random.default_rng(5), np.random.default_rng(5)
    zone.reset(rng_z)
    free.reset(rng_f)
    assert rng_z.integers(0, 2**31) == rng_f.integers(0, 2**31)  # the same draws consumed
    assert zone.offsets[(USE2, "1xL4")] == zone.offsets[(USE2, "4xL4")]
    assert free.offsets[(USE2, "1xL4")] != free.offsets[(USE2, "4xL4")]
    series_z = [zone.capacity(t * 300.0) for t in range(100)]
    assert all(c[(USE2, "1xL4")] == c[(USE2, "4xL4")] for c in series_z)
    assert any(c[(USE2, "1xL4")] != c[(USE2, "1xL40S")] for c in series_z)  # another type moves alone
    with pytest.raises(ValueError, match="correlation"):
        SpotAvailability(base, {USE2: _trace()}, correlation="region")


# ----- spot acquisition that fails ------------------------------------------------------------

def test_a_request_beyond_the_trace_fails_and_only_the_new_instances_go() -> None:
    state = FleetState(running={PREFILL.key: 2})
    state.apply_plan(Allocation.of({PREFILL.key: 5}), {PREFILL.key: 200.0}, 60.0)
    assert state.fresh == {PREFILL.key: 3}
    failed = state.fail_acquisitions({(USE2, "1xL40S"): 3}, TEMPLATES, np.random.default_rng(0))
    assert failed == {PREFILL.key: 2}
    assert state.running == {PREFILL.key: 2} and state.starting_count(PREFILL.key) == 1
    # nothing over the trace: nothing fails
    assert state.fail_acquisitions({(USE2, "1xL40S"): 3}, TEMPLATES, np.random.default_rng(0)) == {}


class _Scarce:
    """A spot pool of 1xL40S that offers 10 nodes but has 3; 1xL4 always plenty."""

    def reset(self, rng: np.random.Generator) -> None:
        return None

    def capacity(self, seconds: float) -> Mapping[tuple[str, str], int]:
        return {(USE2, "1xL40S"): 3, (USE2, "1xL4"): 100}

    def offered(self) -> dict[tuple[str, str], int]:
        return {(USE2, "1xL40S"): 10, (USE2, "1xL4"): 100}


def _acquire(acquisition: str) -> list[dict[str, object]]:
    rates = np.full(6 * 288, 1.0)
    rates[4 * 288 + 1:] = 3.0  # needs 8 prefill instances from step 1 on
    env = FleetEnv(tiny(demand=(series(rates),), spot_acquisition=acquisition, availability="spot",
                        prices="spot", observation="v3"))
    env._availability = _Scarce()  # type: ignore[assignment]
    env.market.offered = env._availability.offered() if acquisition == "trace" else {}
    env.reset(seed=0, options={"day": 5, "planning": "oracle"})
    infos = []
    for _ in range(4):
        obs, _, _, _, info = env.step(np.array([1]))
        info["obs"] = obs
        info["refused"] = obs[-1]  # refused/<last gpu type>
        info["names"] = feature_names(env.models, env.gpu_types, risk=True)
        infos.append(info)
    return infos


def test_the_planner_asks_for_what_a_pool_offers_and_learns_it_is_full() -> None:
    trace = _acquire("trace")
    seen = _acquire("seen")
    assert trace[0]["total"]["failed_acquisitions"] > 0
    assert all(i["total"]["failed_acquisitions"] == 0 for i in seen)
    # believed full for the back-off: the next re-plan does not ask again
    assert trace[1]["total"]["failed_acquisitions"] == 0
    names = trace[0]["names"]
    obs = trace[0]["obs"]
    assert obs[names.index("refused/L40S")] > 0  # type: ignore[union-attr]
    assert seen[0]["obs"][names.index("refused/L40S")] == 0  # type: ignore[index]


APN2 = "aws:ap-northeast-2"
ALT = Template(Service(MODEL, Phase.PREFILL), APN2, (("1xL40S", 1),), (Stage(40, ("1xL40S",)),), 800.0)


class _ScarceHere(_Scarce):
    """As :class:`_Scarce`, with a dearer pool in another region that has plenty."""

    def capacity(self, seconds: float) -> Mapping[tuple[str, str], int]:
        return {**super().capacity(seconds), (APN2, "1xL40S"): 100}

    def offered(self) -> dict[tuple[str, str], int]:
        return {**super().offered(), (APN2, "1xL40S"): 100}


def _refused_then(retries: int, monkeypatch: pytest.MonkeyPatch, solves: list[int] | None = None
                  ) -> tuple[dict[str, object], FleetEnv]:
    import atoll.envs.fleet_env as fleet_env
    import atoll.envs.planner as planner

    monkeypatch.setattr(fleet_env, "ACQUIRE_RETRIES", retries)
    if solves is not None:  # count the re-plans' solves (a count, not seconds: machines are noisy)
        real = planner.solve_allocation

        def counted(*args: object, **kwargs: object) -> object:
            solves.append(1)
            return real(*args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(planner, "solve_allocation", counted)
    rates = np.full(6 * 288, 1.0)
    rates[4 * 288 + 3:] = 3.0  # the look-ahead sees it at step 1
    env = FleetEnv(tiny(demand=(series(rates),), templates=(PREFILL, ALT, DECODE), spot_acquisition="trace",
                        availability="spot", prices="spot"))
    env._availability = _ScarceHere()  # type: ignore[assignment]
    env.market.offered = env._availability.offered()
    env.reset(seed=0, options={"day": 5, "planning": "oracle"})
    env.step(np.array([0]))
    _, _, _, _, info = env.step(np.array([1]))
    return info, env


def test_a_refused_request_is_re_planned_at_once_on_a_pool_that_has_nodes(monkeypatch: pytest.MonkeyPatch
                                                                          ) -> None:
    with_retry: list[int] = []
    info, env = _refused_then(3, monkeypatch, with_retry)
    assert info["total"]["failed_acquisitions"] > 0
    planned = env.state.planned().as_dict()
    assert planned.get(ALT.key, 0) > 0 and planned.get(PREFILL.key, 0) == 3  # the pool's 3 nodes
    no_retry: list[int] = []
    _, env0 = _refused_then(0, monkeypatch, no_retry)
    assert env0.state.planned().as_dict().get(ALT.key, 0) == 0  # waits for the next decision
    assert len(with_retry) > len(no_retry)  # the refused request was re-planned within the step


# ----- scale-down that drains or loses --------------------------------------------------------

def _scale_down(scale_down: str) -> dict[str, object]:
    rates = np.full(6 * 288, 3.0)
    rates[4 * 288 + 1:] = 1.0  # demand falls at step 1: a pure scale-down
    env = FleetEnv(tiny(demand=(series(rates),), scale_down=scale_down))
    env.reset(seed=0, options={"day": 5, "planning": "oracle"})
    env.step(np.array([0]))
    _, _, _, _, info = env.step(np.array([1]))
    return info


def test_a_scale_down_that_loses_drops_in_flight_requests_and_bills_no_drain() -> None:
    drain, lose = _scale_down("drain"), _scale_down("lose")
    assert drain["total"]["lost_in_flight"] == 0
    assert lose["total"]["lost_in_flight"] > 0
    assert lose["total"]["slo_attainment"] < drain["total"]["slo_attainment"]
    assert lose["total"]["cost_usd"] < drain["total"]["cost_usd"]  # no drain billed


def test_a_stopped_instance_is_counted_once_for_its_owner() -> None:
    state = FleetState(running={PREFILL.key: 3})
    state.apply_plan(Allocation.of({PREFILL.key: 1}), {PREFILL.key: 200.0}, 0.0)
    assert state.stopped == {PREFILL.key: 2} and state.draining == {}


# ----- the observation of risk and the new id -------------------------------------------------

def test_v3_is_registered_beside_the_old_ids_and_the_old_worlds_keep_their_settings() -> None:
    assert {envs.ENV_ID_V0, envs.ENV_ID, envs.ENV_ID_V2, envs.ENV_ID_V3} <= set(gym.registry)
    kwargs = gym.registry[envs.ENV_ID_V3].kwargs
    assert kwargs["startup"] == "sampled" and kwargs["preemption"] == "zone"
    assert kwargs["spot_acquisition"] == "trace" and kwargs["observation"] == "v3"
    for old in (envs.ENV_ID_V0, envs.ENV_ID, envs.ENV_ID_V2):
        assert not {"startup", "preemption", "spot_acquisition", "scale_down"} & set(gym.registry[old].kwargs)
    default = FleetConfig()
    assert (default.startup, default.preemption, default.spot_acquisition, default.scale_down) == (
        "fixed", "independent", "seen", "drain")
    with pytest.raises(InputError, match="'scale_down'"):
        FleetConfig(scale_down="vanish")


def test_the_v3_space_the_features_and_the_docstring_agree() -> None:
    env = FleetEnv(tiny(observation="v3", startup="sampled", spot_acquisition="trace", availability="spot",
                        prices="spot"))
    m, g = len(env.models), len(env.gpu_types)
    names = feature_names(env.models, env.gpu_types, risk=True)
    assert env.observation_space.shape == (observation_size(m, g, risk=True),) == (len(names),)
    assert observation_size(m, g, risk=True) == 19 * m + 3 * g + 4
    obs, _ = env.reset(seed=0)
    assert env.observation_space.contains(obs)
    for _ in range(3):
        obs, *_ = env.step(env.action_space.sample())
        assert env.observation_space.contains(obs)
    low, high = env.observation_space.low, env.observation_space.high
    i = names.index(f"{MODEL}/queue_growth")
    assert (low[i], high[i]) == (-1.0, 1.0)
    # the docstring's rows name the risk features in order, with the space's bounds
    rows = re.findall(r"^\s*12 [mM][^`]*``([^`]+)``.*?\s(-?\d+)\s+(-?\d+)\s*$", FleetEnv.__doc__ or "",
                      flags=re.MULTILINE)
    tail = [(name.split("/")[-1] if "<model>" in name or "/" not in name else name.split("/")[0], float(lo),
             float(hi)) for name, lo, hi in rows][-(len(RISK_FEATURES) + len(POOL_FEATURES)):]
    assert tail == [(f[0], f[2], f[3]) for f in RISK_FEATURES + POOL_FEATURES]
    for f in RISK_FEATURES:
        j = names.index(f"{MODEL}/{f[0]}")
        assert (low[j], high[j]) == (f[2], f[3])


def test_v3_passes_the_checkers_with_warnings_as_errors_and_is_deterministic() -> None:
    import warnings

    from gymnasium.utils.env_checker import check_env as gym_check

    config = tiny(availability="spot", prices="spot")
    env = gym.make(envs.ENV_ID_V3, config=config)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gym_check(env.unwrapped, skip_render_check=True)

    def rollout(seed: int) -> list[tuple[object, ...]]:
        inner = FleetEnv(config, **{k: v for k, v in gym.registry[envs.ENV_ID_V3].kwargs.items()})
        inner.action_space.seed(seed)
        obs, _ = inner.reset(seed=seed)
        out: list[tuple[object, ...]] = [obs.tobytes()]
        for _ in range(30):
            obs, reward, _, _, info = inner.step(inner.action_space.sample())
            total = info["total"]
            out.append((obs.tobytes(), reward, total["failed_acquisitions"], total["free_nodes"],
                        total["preemptions"], inner.state.planned().counts))
        return out

    assert rollout(4) == rollout(4)
