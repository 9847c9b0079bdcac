"""``atoll control`` as users run it: bad input, the tick schedule, SIGTERM and kill -9."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from control_helpers import kill_9, tiny_series

from atoll.control.cli import main
from atoll.control.cli.control import parse_interval
from atoll.control.replay import ReplayExporter
from atoll.control.state import load_state
from atoll.solvers.errors import InputError

CORE = ("Phi-4-14B", "GPT-OSS-20B", "Qwen3-32B")


def test_parse_interval() -> None:
    assert parse_interval("60s") == 60 and parse_interval("5m") == 300 and parse_interval("1h") == 3600
    assert parse_interval("2.5") == 2.5
    for bad in ("0s", "-1m", "soon", "5d"):
        with pytest.raises(InputError, match="--interval"):
            parse_interval(bad)


@pytest.mark.parametrize(("extra", "message"), [
    ([], "exactly one of --prometheus"),
    (["--scrape", "http://127.0.0.1:1", "--prometheus", "http://127.0.0.1:2"], "exactly one of"),
    (["--scrape", "http://127.0.0.1:1", "--policy", "sometimes"], "unknown policy 'sometimes'"),
    (["--scrape", "http://127.0.0.1:1", "--scenario", "huge"], "huge"),
    # a learned policy of another fleet is refused, never run half-way
    (["--scrape", "http://127.0.0.1:1", "--policy", "learned:file:training/policies/extended-spot-charged"],
     "does not fit"),
    # a policy that observes the risk needs the pool event log, and the log must exist
    (["--scrape", "http://127.0.0.1:1", "--policy", "learned:file:training/policies/core-spot-charged"],
     "--pool-events FILE"),
    (["--scrape", "http://127.0.0.1:1", "--policy", "learned:file:training/policies/core-spot-charged",
      "--pool-events", "/nonexistent/events.jsonl"], "no such file; create it empty"),
    (["--scrape", "http://127.0.0.1:1", "--interval", "often"], "--interval 'often'"),
    # the simulator's references plan for demand no live controller knows
    (["--scrape", "http://127.0.0.1:1", "--policy", "hindsight"], "plans for the oracle demand"),
    (["--scrape", "http://127.0.0.1:1", "--policy", "oracle-quantile@0.9"], "oracle-quantile demand"),
])
def test_bad_arguments_are_named(tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str],
                                 message: str) -> None:
    code = main(["control", "--state", str(tmp_path / "s"), "--sink", f"json:{tmp_path / 'p'}", "--once",
                 *extra])
    assert code == 2
    assert message in capsys.readouterr().err.replace("\n", "")


def test_bad_sink_and_fleet_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["control", "--state", str(tmp_path / "s"), "--scrape", "http://127.0.0.1:1", "--once"]
    assert main([*base, "--sink", "s3:bucket"]) == 2
    assert "unknown plan sink 's3:bucket'" in capsys.readouterr().err
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(json.dumps({  # JSON is YAML: a YAML fleet file, written as JSON
        "name": "bad-fleet", "models": ["Phi-4-14B"], "regions": [{"name": "aws:us-east-2", "catalog": True}],
        "availability": {"static": {"aws:us-east-2/4xL4": -1}},
        "workloads": {"Phi-4-14B": {"source": "azure:code", "mean_rate": 10}}}))
    assert main([*base, "--sink", f"json:{tmp_path}", "--fleet", str(fleet)]) == 2
    err = capsys.readouterr().err.replace("\n", "")
    assert str(fleet) in err and "['aws:us-east-2/4xL4']: field 'nodes' must be a whole number >= 0" in err
    assert main([*base, "--sink", f"json:{tmp_path}", "--fleet", str(tmp_path / "none.yaml")]) == 2
    assert "not found" in capsys.readouterr().err.replace("\n", "")
    # the retired JSON format: refused, with the YAML fleet file to use instead
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"scenario": "core", "availability": {"aws:us-east-2/4xL4": 2}}))
    assert main([*base, "--sink", f"json:{tmp_path}", "--fleet", str(old)]) == 2
    err = capsys.readouterr().err
    assert str(old) in err.replace("\n", "") and "the JSON fleet format is retired" in err
    assert '"aws:us-east-2/4xL4": 2' in err


def test_a_corrupt_state_file_is_refused_not_replaced(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "s"
    state.mkdir()
    (state / "controller-state.json").write_text("{not json")
    code = main(["control", "--state", str(state), "--sink", f"json:{tmp_path / 'p'}", "--scrape",
                 "http://127.0.0.1:1", "--once"])
    assert code == 2 and "is not valid JSON" in capsys.readouterr().err.replace("\n", "")
    assert (state / "controller-state.json").read_text() == "{not json"


def _wait_for_tick(state: Path, tick: int, proc: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        try:
            saved = load_state(state)
        except Exception:  # noqa: BLE001 - a concurrent replace may be mid-flight on some filesystems
            saved = None
        if saved is not None and saved.tick >= tick:
            return
        time.sleep(0.1)
    raise AssertionError(f"the controller did not reach tick {tick} within {timeout_s:g} s")


@pytest.fixture
def replay() -> ReplayExporter:
    series = [tiny_series(f"w{i}", [2.0 + i] * 600, input_tokens=500, output_tokens=50) for i in range(3)]
    with ReplayExporter(series, list(CORE), speedup=60.0) as exporter:
        yield exporter


def _controller(replay: ReplayExporter, tmp_path: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "atoll.control.cli", "control", "--scrape", replay.url,
            "--scenario", "core",
            "--policy", "fixed:1", "--state", str(tmp_path / "state"), "--sink", f"json:{tmp_path / 'plans'}",
            "--interval", "60s", "--time-scale", "60", *extra]


def test_sigterm_finishes_the_tick_persists_and_exits_0(replay: ReplayExporter, tmp_path: Path) -> None:
    proc = subprocess.Popen(_controller(replay, tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            cwd=Path(__file__).resolve().parents[2])
    try:
        _wait_for_tick(tmp_path / "state", 3, proc)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err.decode()
    assert "SIGTERM: finishing the tick in progress" in err.decode()
    saved = load_state(tmp_path / "state")
    assert saved is not None and saved.tick >= 3 and saved.running and saved.pending is None
    assert json.loads((tmp_path / "plans" / "latest.json").read_text())["plan"] == saved.running


def test_kill_9_then_the_next_start_resumes(replay: ReplayExporter, tmp_path: Path) -> None:
    proc = subprocess.Popen(_controller(replay, tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            cwd=Path(__file__).resolve().parents[2])
    try:
        _wait_for_tick(tmp_path / "state", 3, proc)
    finally:
        kill_9(proc)
    saved = load_state(tmp_path / "state")
    assert saved is not None and saved.running
    out = subprocess.run(_controller(replay, tmp_path, "--once", "--json"), capture_output=True,
                         cwd=Path(__file__).resolve().parents[2], timeout=120)
    assert out.returncode == 0, out.stderr.decode()
    report = json.loads(out.stdout)
    assert report["tick"] == saved.tick  # numbering continues from the persisted state
    assert "resuming from" in out.stderr.decode()
    assert all(r["status"] == "ok" for r in report["metrics"]["rates"].values())  # baseline kept
    for key in ("decision", "plan_changed", "diff", "sink_result"):
        assert key in report


def test_once_with_metrics_down_holds_saves_and_exits_1(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    from control_helpers import closed_port

    code = main(["control", "--scrape", f"http://127.0.0.1:{closed_port()}", "--state", str(tmp_path / "s"),
                 "--sink", f"json:{tmp_path / 'p'}", "--once", "--json"])
    captured = capsys.readouterr()
    assert code == 1
    report = json.loads(captured.out)
    assert report["metrics"]["ok"] is False and "cannot connect" in report["metrics"]["error"]
    assert report["plan_changed"] is False and report["sink_result"] is None
    assert "check that the server is up" in captured.err.replace("\n", " ")
    assert load_state(tmp_path / "s").tick == 1  # type: ignore[union-attr]


@pytest.mark.parametrize(("policy", "level", "levels", "risk"), [
    ("fixed:1@0.5", 0.5, None, None),
    ("fixed:1@0.9+h0.7", 0.9, None, "h0.7"),
    ("per-model:1@0.9,1@0.95,1@0.95", 0.95, (0.9, 0.95), None),
    ("per-model:1@0.9+h0.7,1@0.9,1@0.9+h0.7", 0.9, (0.9,), "h0.7"),
])
def test_the_policys_level_levels_and_risk_configure_the_controller(tmp_path: Path, policy: str, level: float,
                                                                     levels: tuple[float, ...] | None,
                                                                     risk: str | None) -> None:
    # as the simulator's env takes them (training.evaluate.env_at_level): nothing dropped
    from atoll.control.cli import build_parser
    from atoll.control.cli.control import build_controller

    args = build_parser("control").parse_args(["control", "--scrape", "http://127.0.0.1:1", "--state",
                                               str(tmp_path / "s"), "--sink", f"json:{tmp_path / 'p'}",
                                               "--policy", policy])
    c = build_controller(args, clock=lambda: 0.0)
    assert c.settings.planning_quantile == level and c.settings.action_levels == levels
    assert (c.risk.label() if c.risk is not None else None) == risk


def test_a_shipped_fleet_v4_policy_runs_live_with_its_observation_of_risk(replay: ReplayExporter,
                                                                          tmp_path: Path) -> None:
    # the charged world's learned policy: its codes' risk presets decoded, the risk observed
    events = tmp_path / "events.jsonl"
    events.write_text("")
    cmd = _controller(replay, tmp_path, "--once", "--json", "--pool-events", str(events))
    shipped = Path(__file__).resolve().parents[3] / "training" / "policies" / "core-spot-charged"
    cmd[cmd.index("fixed:1")] = f"learned:file:{shipped}"
    ticks = []
    for _ in range(2):
        out = subprocess.run(cmd, capture_output=True, cwd=Path(__file__).resolve().parents[2], timeout=180,
                             env={**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"})
        assert out.returncode == 0, out.stderr.decode()
        report = json.loads(out.stdout)
        ticks.append(report["tick"])
        risk = report["metrics"]["risk"]
        assert risk["ok"] and set(risk["latency_miss"]) == set(CORE) and risk["ignored_count"] == 0
        labels = report["decision"]["reoptimization"].values()
        assert all(label.startswith(("full@0.9", "grow@0.9")) for label in labels)
    assert ticks[1] > ticks[0]  # the second run resumed the first's state (its requested-nodes log too)


def test_an_atoll_tune_file_runs_live_and_a_file_of_other_models_is_refused(tmp_path: Path) -> None:
    """``atoll tune`` writes the policy a fleet runs: the controller takes the file as it is, and
    refuses one tuned for other models (a per-model rule's entries follow the models' order)."""
    from atoll.control.cli import build_parser
    from atoll.control.cli.control import build_controller
    from atoll.envs.vocabulary import parse_policy
    from atoll.training.tuning import TunedPolicy

    def tuned(models: tuple[str, ...], policy: str) -> Path:
        entries = dict(zip(models, policy.removeprefix("per-model:").split(","), strict=True))
        value = TunedPolicy(parse_policy(policy), entries, "charged", "core", "spot", "servegen", "peak:auto",
                            (8, 10), 2, (11, 14), 2, 0.0)
        return value.write(tmp_path / f"{len(models)}.yaml")

    def controller(path: Path):  # noqa: ANN202
        args = build_parser("control").parse_args(["control", "--scrape", "http://127.0.0.1:1", "--state",
                                                   str(tmp_path / "s"), "--sink", f"json:{tmp_path / 'p'}",
                                                   "--policy", str(path)])
        return build_controller(args, clock=lambda: 0.0)

    c = controller(tuned(CORE, "per-model:1@0.9+h0.7,1@0.9,1@0.9+h0.7"))
    assert c.settings.planning_quantile == 0.9 and c.settings.action_levels == (0.9,)
    assert c.risk is not None and c.risk.label() == "h0.7"
    with pytest.raises(InputError, match="was tuned for models"):
        controller(tuned(("Qwen3-32B", "GPT-OSS-20B", "Phi-4-14B"), "per-model:1@0.9,1@0.9,1@0.9"))
