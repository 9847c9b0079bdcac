"""The README walk-through, exactly: a user's CSV request log and fleet file -> the template
library -> a plan -> a trained policy -> a replay of the fleet's demand -> controller ticks that
write Kubernetes manifests. Tiny budgets; every manifest is validated."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from control_helpers import closed_port
from fleet_helpers import write_fleet
from http_ready import answers_within
from test_k8s_manifests import k8s_validate

from atoll.control.cli import main
from atoll.control.k8s.apply import validate_object


@pytest.fixture()
def fleet_file(tmp_path: Path) -> Iterator[Path]:
    yield write_fleet(tmp_path)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert code == 0, err[-3000:]
    return json.loads(out)


def wait_for(url: str, timeout_s: float = 60.0) -> None:
    if not answers_within(url, timeout_s):
        raise AssertionError(f"{url} did not come up within {timeout_s:g} s")


def test_readme_walkthrough(fleet_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    t0 = time.perf_counter()
    fleet = str(fleet_file)
    lib = run(capsys, "templates", "build", "--fleet", fleet, "--json")
    assert lib["spec"]["runtime"] == "vllm" and lib["total_templates"] > 0
    assert set(lib["spec"]["models"]) == {"Phi-4-14B", "Acme-8B"}
    plan = run(capsys, "solve", "--fleet", fleet, "--json")
    assert plan["status"] == "optimal" and plan["fleet"] == fleet and plan["runtime"] == "vllm"
    trained = run(capsys, "train", "--fleet", fleet, "--train-days", "4-4", "--timesteps", "256",
                  "--bootstrap-steps", "64", "--seed", "0", "--run-dir", str(tmp_path / "run"), "--json")
    uri = trained["model_uri"]
    port = closed_port()
    replay = subprocess.Popen([sys.executable, "-m", "atoll.control.cli", "replay", "--fleet", fleet,
                               "--speedup", "60", "--start-day", "5", "--port", str(port), "--json"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(f"http://127.0.0.1:{port}/metrics")
        argv = ["control", "--fleet", fleet, "--scrape", f"http://127.0.0.1:{port}", "--policy",
                f"learned:{uri}", "--state", str(tmp_path / "state"),
                "--sink", f"k8s:{tmp_path / 'manifests'}",
                "--time-scale", "60", "--once", "--json"]
        tick = run(capsys, *argv)  # a first run takes its two samples itself, then plans and delivers
    finally:
        replay.terminate()
        replay.wait(timeout=30)
    assert tick["plan_changed"] and tick["sink_result"]["ok"], json.dumps(tick)[:2000]
    files = sorted((tmp_path / "manifests").glob("atoll-*.yaml"))
    kinds = set()
    for path in files:
        doc = yaml.safe_load(path.read_text())
        k8s_validate(doc)
        validate_object(doc, str(path))
        kinds.add(doc["kind"])
        assert doc["metadata"]["namespace"] == "llm"  # the fleet file's kubernetes section
    assert {"Service"} < kinds and any("acme/acme-8b" in p.read_text() for p in files)
    print(f"walk-through wall time {time.perf_counter() - t0:.1f} s, {len(files)} manifests")
