"""The typed vocabulary: every policy spelling the commands and docs accept parses to a value that
prints back to the same text, bad text is an error naming it, and the policies built from text
and from the value are the same."""

from __future__ import annotations

import pytest

from atoll.envs.actions import ActionCodec
from atoll.envs.policies import make_policy, rule_grid
from atoll.envs.vocabulary import (
    DEFAULT_LEVEL,
    PLANNING_LEVELS,
    PolicySpec,
    Reoptimization,
    check_level,
    parse_level,
    parse_policy,
)
from atoll.forecast.backtest import PLAN_LEVEL
from atoll.forecast.planning import SELECT_LEVEL
from atoll.solvers.errors import InputError, UnknownNameError
from atoll.training.contest import REFERENCE_RULE, reference_rule
from atoll.training.naming import policy_params
from atoll.training.per_model import PerModelRule, assignment_spec, fixed_option, option_name

CANONICAL = [
    "fixed:1", "fixed:3@0.95", "fixed:12@0.5", "threshold", "threshold@0.7", "threshold:0.5:1",
    "threshold:0.3:1.1@0.99", "grow:6", "grow:6@0.9", "never", "hindsight", "oracle-rate",
    "per-model:1@0.9,6@0.5", "per-model:3@0.95", "learned:models:/atoll-trigger-core/3",
    "learned:atoll-trigger-core@champion", "learned:runs:/0123abcd/policy", "learned:champion",
]


@pytest.mark.parametrize("text", CANONICAL + rule_grid())
def test_every_spelling_prints_back_to_its_text(text: str) -> None:
    spec = parse_policy(text)
    assert str(spec) == text
    assert parse_policy(str(spec)) == spec
    assert parse_policy(spec) is spec


def test_the_parts_are_typed() -> None:
    assert parse_policy("fixed:3@0.95") == PolicySpec("fixed", every=3, level=0.95)
    assert parse_policy("threshold:0.3:1.1") == PolicySpec("threshold", band=(0.3, 1.1))
    assert parse_policy(" grow:2@0.7 ") == PolicySpec("grow", every=2, level=0.7)
    per_model = parse_policy("per-model:1@0.9,6@0.5,6@0.5")
    assert per_model.entries == ((1, 0.9), (6, 0.5), (6, 0.5)) and per_model.levels == (0.9, 0.5, 0.5)
    assert per_model.planning_level(0.7) == 0.5  # the most common level
    assert parse_policy("per-model:1@0.9,6@0.5").planning_level(0.7) == 0.9  # a tie: the highest
    assert parse_policy("fixed:1").planning_level(0.7) == 0.7 and parse_policy("never").level is None
    learned = parse_policy("learned:models:/m-0123@x")
    assert learned.is_learned and learned.uri == "models:/m-0123@x" and learned.level is None
    # a non-canonical spelling parses to the canonical value
    assert str(parse_policy("threshold:0.50:1.0@0.90")) == "threshold:0.5:1@0.9"


@pytest.mark.parametrize(("text", "error", "match"), [
    ("sometimes", UnknownNameError, "unknown policy 'sometimes'"),
    ("fixed:0", InputError, "fixed:K needs K >= 1"),
    ("fixed", InputError, "wrong number of arguments"),
    ("fixed:x", InputError, "bad policy 'fixed:x'"),
    ("threshold:0.5", InputError, "wrong number of arguments"),
    ("fixed:1@0.42", InputError, "planning level 0.42 is not forecast"),
    ("fixed:1@high", InputError, "planning level 'high' is not a number"),
    ("never@0.9", InputError, "never takes no planning level"),
    ("oracle-rate@0.9", InputError, "oracle-rate takes no planning level"),
    ("per-model:1@0.9,x@0.5", InputError, "entry 'x@0.5' is not K@q"),
    ("per-model:1@0.9,3", InputError, "not a planning level"),
    ("per-model:0@0.9", InputError, "needs K >= 1"),
    ("per-model:", InputError, "gives no K@q entries"),
    ("learned:", InputError, "learned:<uri> needs"),
])
def test_bad_text_names_itself_and_the_grammar(text: str, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        parse_policy(text)


def test_a_spec_refuses_fields_of_another_kind() -> None:
    with pytest.raises(InputError, match="'every'"):
        PolicySpec("threshold", every=2)
    with pytest.raises(InputError, match="'band'"):
        PolicySpec("fixed", every=1, band=(0.5, 1.0))
    with pytest.raises(InputError, match="not forecast"):
        PolicySpec("fixed", every=1, level=0.42)
    with pytest.raises(InputError, match="'entries'"):
        PolicySpec("per-model")


def test_a_rule_is_named_by_its_specs_canonical_text() -> None:
    for text in ("fixed:3@0.95", "threshold:0.3:1.1@0.7", "grow:6", "never", "hindsight"):
        rule = make_policy(parse_policy(text), 2)
        assert (rule.name, rule.planning_quantile) == (text, parse_policy(text).level)
    assert make_policy(parse_policy(" threshold:0.50:1.0@0.90 "), 2).name == "threshold:0.5:1@0.9"
    rule = PerModelRule.parse(parse_policy("per-model:1@0.9,6@0.5"), 2)
    assert (rule.every, rule.levels, rule.name) == ((1, 6), (0.9, 0.5), "per-model:1@0.9,6@0.5")


def test_reoptimizations_print_back_and_match_the_action_codes() -> None:
    codec = ActionCodec((0.9, 0.7, 0.95))
    for code, label in enumerate(codec.names()):
        r = Reoptimization.parse(label)
        assert r == codec.decode(code) and str(r) == label
    assert Reoptimization.parse("full") == Reoptimization("full", None)
    with pytest.raises(InputError, match="'kind'"):
        Reoptimization.parse("shrink@0.9")
    with pytest.raises(InputError, match="not a number"):
        Reoptimization.parse("grow@x")
    with pytest.raises(InputError, match="'level'"):
        Reoptimization("hold", 0.9)


def test_one_default_level_and_one_set_of_levels() -> None:
    assert DEFAULT_LEVEL == PLAN_LEVEL == SELECT_LEVEL == 0.9 and DEFAULT_LEVEL in PLANNING_LEVELS
    from atoll.control.controller import ControllerSettings
    from atoll.envs.config import FleetConfig

    assert FleetConfig().planning_quantile == ControllerSettings().planning_quantile == DEFAULT_LEVEL
    assert parse_level("0.95") == check_level(0.95) == 0.95
    with pytest.raises(InputError, match="not forecast"):
        check_level(0.42)


def test_readers_of_the_grammar_agree() -> None:
    """The per-model table's options, the contest's reference rule and the MLflow parameters all
    read the text through the one parser."""
    def specs(*texts: str) -> list[PolicySpec]:
        return [parse_policy(t) for t in texts]

    assert fixed_option(parse_policy("fixed:3@0.95")) == (3, 0.95)
    assert option_name((3, 0.95)) == "fixed:3@0.95"
    assert [fixed_option(s) for s in specs("fixed:3", "threshold@0.9", "per-model:1@0.9")] == [None] * 3
    assert assignment_spec([(1, 0.9), (6, 0.5)]) == "per-model:1@0.9,6@0.5"
    assert REFERENCE_RULE == "fixed:1@0.9" and \
        reference_rule(specs("fixed:6@0.9", "fixed:2@0.9")) == parse_policy("fixed:2@0.9")
    assert reference_rule(specs("fixed:1@0.95", "threshold:0.5:1@0.9")) is None
    assert policy_params(parse_policy("fixed:3@0.95")) == {
        "policy": "fixed:3@0.95", "policy.kind": "fixed", "policy.planning_quantile": "0.95",
        "policy.every_steps": "3"}
    assert policy_params(parse_policy("threshold:0.3:1.1")) == {
        "policy": "threshold:0.3:1.1", "policy.kind": "threshold", "policy.planning_quantile": "env",
        "policy.low": "0.3", "policy.high": "1.1"}
    assert policy_params(parse_policy("learned:models:/x/1")) == {
        "policy": "learned:models:/x/1", "policy.kind": "learned", "policy.model_uri": "models:/x/1"}
    assert policy_params(parse_policy("per-model:1@0.9")) == {"policy": "per-model:1@0.9",
                                                              "policy.kind": "per-model"}
