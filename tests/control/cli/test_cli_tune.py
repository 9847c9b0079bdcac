"""``atoll tune``: the rule chosen on validation days, reported on test days, written as a policy
file every --policy takes; bad input and bad files are named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from atoll.control.cli import main
from atoll.control.cli.common import policy_value, split_policies
from atoll.envs.vocabulary import parse_policy
from atoll.solvers.errors import InputError
from atoll.training.evaluate import resolve_policy
from atoll.training.tuning import read_tuned


def test_tune_writes_a_file_simulate_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "policy.yaml"
    code = main(["tune", "--scenario", "core", "--validation-days", "8-8", "--test-days", "11-11",
                 "--seeds", "2", "--levels", "0.9", "--intervals", "1", "--risks", "neutral;h0.7",
                 "--workers", "1", "--forecaster", "naive", "--out", str(out), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0
    tuned = read_tuned(out)
    assert str(tuned.policy) == doc["policy"]
    assert list(tuned.models) == ["Phi-4-14B", "GPT-OSS-20B", "Qwen3-32B"]
    assert tuned.world == "exact" and tuned.validation_days == (8, 8) and tuned.test_days == (11, 11)
    ev = tuned.evidence
    # chosen on the validation days among the grid and the per-model descent; the baseline and the
    # chosen policy both ran on the test days, paired over the two seeds
    chosen = str(tuned.policy)
    assert ev["baseline"] == "fixed:1@0.9" and chosen in ev["test"] and "fixed:1@0.9" in ev["test"]
    assert len(ev["test"]["fixed:1@0.9"]["effective_usd_per_seed"]) == 2
    if chosen != "fixed:1@0.9":
        assert ev["effective_cost_vs_baseline"][chosen]["low"] is not None
    assert "atoll tune --scenario core" in tuned.command
    # every --policy takes the file: simulate runs what it chose
    code = main(["simulate", "--scenario", "core", "--days", "11", "--forecaster", "naive", "--policy",
                 f"{out},fixed:1@0.9", "--json"])
    sim = json.loads(capsys.readouterr().out)
    assert code == 0 and set(sim["policies"]) == {chosen, "fixed:1@0.9"}


def test_tune_takes_a_fleet_files_own_series_and_market(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "fleet.yaml"
    code = main(["tune", "--fleet", "core", "--validation-days", "8-8", "--test-days", "11-11",
                 "--seeds", "1",
                 "--levels", "0.9", "--intervals", "1", "--risks", "neutral", "--workers", "1",
                 "--forecaster", "naive", "--out", str(out), "--json"])
    assert code == 0, capsys.readouterr().err
    tuned = read_tuned(out)
    assert tuned.availability == "market" and tuned.scenario == "core" and len(tuned.models) == 3


def test_a_policy_list_keeps_per_model_entries_and_risk_parts_together() -> None:
    assert split_policies("fixed:1,per-model:1@0.9+h0.85,s0.5,3@0.95,1@0.9,fixed:3@0.9+h0.7,f0.3,p.yaml",
                          "--policy") == ["fixed:1", "per-model:1@0.9+h0.85,s0.5,3@0.95,1@0.9",
                                          "fixed:3@0.9+h0.7,f0.3", "p.yaml"]


def test_bad_policy_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"policy file .*none.yaml not found.*atoll tune --out"):
        policy_value(str(tmp_path / "none.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: something-else\n")
    with pytest.raises(InputError, match="not an atoll policy"):
        read_tuned(bad)
    good = {"kind": "atoll-policy", "format": 1, "policy": "fixed:1@0.9+h0.7",
            "models": {"a": "fixed:1@0.9+h0.7", "b": "fixed:1@0.9+h0.7"}, "world": "charged",
            "scenario": "core",
            "availability": "spot", "workload": "servegen", "forecaster": "peak:auto",
            "chosen_on": {"days": [8, 10], "seeds": 1}, "reported_on": {"days": [11, 14], "seeds": 3},
            "lost_usd_per_mtok": 2.0}
    bad.write_text(yaml.safe_dump({**good, "format": 7}))
    with pytest.raises(InputError, match="format 7"):
        read_tuned(bad)
    bad.write_text(yaml.safe_dump({k: v for k, v in good.items() if k != "chosen_on"}))
    with pytest.raises(InputError, match="field 'chosen_on' missing"):
        read_tuned(bad)
    bad.write_text(yaml.safe_dump(good))
    with pytest.raises(InputError, match="tuned for 2 models"):
        resolve_policy(policy_value(str(bad)), 3)
    assert resolve_policy(policy_value(str(bad)), 2).risk.label() == "h0.7"  # type: ignore[attr-defined]


@pytest.mark.parametrize(("argv", "message"), [
    (("--levels", "high"), "--levels 'high' must be planning levels"),
    (("--out", "policy.json"), "a policy file ends in .yaml"),
    (("--validation-days", "11-12"), "overlap test days"),
])
def test_tune_bad_input_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: tuple[str, ...],
                                message: str) -> None:
    assert main(["tune", "--scenario", "core", *argv]) == 2
    assert message in capsys.readouterr().err.replace("\n", " ")


def test_learned_candidates_are_the_policies_trained_for_the_fleet_market_and_world(tmp_path: Path) -> None:
    from atoll.envs import WORLDS
    from atoll.envs.config import FleetConfig
    from atoll.training.tuning import learned_candidates

    def found(availability: str, world: str) -> list[str]:
        return [str(s).rsplit("/", 1)[-1] for s in learned_candidates(
            FleetConfig(scenario="core", availability=availability, **WORLDS[world]))]

    assert found("spot", "exact") == ["core-spot-exact"]
    assert found("spot", "charged") == ["core-spot-charged", "core-spot-charged-1728"]
    assert found("hedged", "exact") == ["core-hedged-exact"] and found("spot", "calibration") == []
    assert learned_candidates(FleetConfig(scenario="core"), "none") == []
    with pytest.raises(InputError, match="--learned 'fixed:1'"):
        learned_candidates(FleetConfig(scenario="core"), [parse_policy("fixed:1")])


def test_a_learned_candidate_competes_on_the_validation_days(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    shipped = Path(__file__).resolve().parents[3] / "training" / "policies" / "core-spot-exact"
    out = tmp_path / "policy.yaml"
    code = main(["tune", "--scenario", "core", "--availability", "spot", "--validation-days", "8-8",
                 "--test-days", "11-11", "--seeds", "1", "--levels", "0.9", "--intervals", "1", "--risks",
                 "neutral", "--workers", "1", "--forecaster", "naive", "--learned", f"learned:file:{shipped}",
                 "--out", str(out), "--json"])
    assert code == 0, capsys.readouterr().err
    ev = read_tuned(out).evidence
    spec = f"learned:file:{shipped}"
    assert ev["learned_candidates"] == [spec] and ev["validation"][spec]["effective_usd"] > 0
    # chosen only when it beats the rule there (a tie keeps the rule)
    val = ev["validation"]
    beats = val[spec]["effective_usd"] < val[ev["best_uniform_rule"]]["effective_usd"]
    assert (ev["chosen"] == spec) == beats and ev["chosen"] in ev["test"]
    assert main(["tune", "--scenario", "core", "--learned", "fixed:1", "--out", str(out)]) == 2
