import math

import pytest
from alloc_instances import template

from atoll.solvers.perf import RequestShape
from atoll.solvers.registry import UnknownNameError
from atoll.solvers.scenarios import (
    AMPLE_NODES,
    SCENARIOS,
    build_problem,
    request_rates,
    request_shapes,
    scenario_demand,
    scenario_prices,
    trace_shape,
)
from atoll.solvers.types import PHASES, Phase


def test_request_shapes_alternate_code_and_conv():
    spec = SCENARIOS["core"]
    shapes = request_shapes(spec)
    code, conv = trace_shape("code"), trace_shape("conv")
    assert shapes == {"Phi-4-14B": code, "GPT-OSS-20B": conv, "Qwen3-32B": code}
    assert code.input_tokens > conv.input_tokens and code.output_tokens < conv.output_tokens


@pytest.mark.parametrize("mix", ["even", "large-heavy", "small-heavy"])
def test_mixes_keep_total_rate(mix):
    for spec in SCENARIOS.values():
        rates = request_rates(spec, mix)
        assert sum(rates.values()) == pytest.approx(spec.req_per_s * len(spec.models))


def test_heavy_mixes_send_80_percent_to_a_third():
    ext = SCENARIOS["extended"]
    large = request_rates(ext, "large-heavy")
    assert large["Qwen3-235B-A22B"] == large["GPT-OSS-120B"] == pytest.approx(60.0)
    assert large["Phi-4-14B"] == pytest.approx(7.5)
    small = request_rates(SCENARIOS["core"], "small-heavy")
    assert small == {"Phi-4-14B": pytest.approx(24.0), "GPT-OSS-20B": pytest.approx(3.0),
                     "Qwen3-32B": pytest.approx(3.0)}


def test_demand_is_rate_times_mean_lengths():
    spec = SCENARIOS["core"]
    shapes = {m: RequestShape(1000.0, 100.0) for m in spec.models}
    demand = scenario_demand(spec, "even", shapes)
    assert demand["Qwen3-32B/prefill"] == pytest.approx(10 * 1000.0)
    assert demand["Qwen3-32B/decode"] == pytest.approx(10 * 100.0)


def _synthetic_core_templates():
    spec = SCENARIOS["core"]
    prices = scenario_prices(spec)
    out = []
    for m in spec.models:
        for phase in PHASES:
            for (region, config), _price in sorted(prices.items()):
                n = int(config.partition("x")[0])
                out.append(template(m, phase, region, {config: 1}, 1500.0 * n if phase is Phase.PREFILL
                                    else 150.0 * n * (1.1 if "L40S" in config else 1.0)))
    return out


def test_ample_and_scarce_availability_definitions():
    templates = _synthetic_core_templates()
    ample = build_problem("core", "ample", templates=templates)
    assert set(ample.availability.values()) == {AMPLE_NODES}
    scarce = build_problem("core", "scarce", templates=templates)
    from atoll.solvers.allocation import solve_allocation

    plan = solve_allocation(ample)
    used: dict = {}
    for key, n in plan.allocation.counts:
        t = ample.template(key)
        for c, k in t.nodes:
            used[(t.region, c)] = used.get((t.region, c), 0) + k * n
    for rc, cap in scarce.availability.items():
        assert cap == (math.ceil(1.25 * used[rc]) if rc in used else 0)
    assert solve_allocation(scarce).status.value == "optimal"  # the even plan still fits


def test_unknown_names_list_valid_ones():
    with pytest.raises(UnknownNameError, match="valid scenarios: core, extended"):
        build_problem("huge", templates=[])
    with pytest.raises(UnknownNameError, match="valid mixes: even, large-heavy, small-heavy"):
        request_rates(SCENARIOS["core"], "uniform")
    with pytest.raises(UnknownNameError, match="ample, scarce"):
        build_problem("core", "plenty", templates=[])


def test_fleet20_is_twenty_fine_tunes_of_the_six_serving_models():
    from atoll.solvers.models import DEFAULT_MODELS, fleet_model_names, get_model

    spec = SCENARIOS["fleet20"]
    assert len(spec.models) == len(set(spec.models)) == 20
    assert spec.models[:6] == DEFAULT_MODELS and spec.models == fleet_model_names(20)
    assert spec.gpu_types == SCENARIOS["extended"].gpu_types and spec.regions == SCENARIOS["extended"].regions
    for name in spec.models[6:]:
        base, _, k = name.rpartition("-ft")
        m, b = get_model(name), get_model(base)
        assert int(k) >= 1 and m.role == "variant" and m.aliases == ()
        # a fine-tune is its base's architecture and SLO under its own name
        assert (m.layers, m.hidden, m.params_b, m.active_params_b, m.slo) == \
            (b.layers, b.hidden, b.params_b, b.active_params_b, b.slo)
    assert sum(1 for m in spec.models if m.startswith("Phi-4-14B")) == 4  # 20 = 6 x 3 + 2
    assert request_rates(spec, "even") == {m: 10.0 for m in spec.models}
    with pytest.raises(ValueError, match="n must be"):
        fleet_model_names(0)


def test_fine_tunes_resolve_by_name_and_stay_out_of_the_unknown_name_error():
    from atoll.solvers.models import get_model

    assert get_model("Qwen3-32B-ft9").layers == get_model("Qwen3-32B").layers
    for bad in ("Qwen3-32B-ft0", "Qwen3-32B-ftx", "Nope-ft1"):
        with pytest.raises(UnknownNameError) as exc:
            get_model(bad)
        assert "-ft1" not in str(exc.value).split("valid")[1]  # only the real models are listed
