"""A fleet file's ``pd`` reaches every consumer of the fleet: the simulator's config, the live
controller's library and its plan, and ``--pd`` overrides it."""

from __future__ import annotations

from pathlib import Path

import yaml
from fleet_helpers import fleet_doc, request_log

from atoll.control.live_fleet import load_fleet_file
from atoll.envs.fleet_file import fleet_config, read_fleet


def _fleet(folder: Path, pd: object) -> Path:
    request_log(folder / "requests.csv")
    doc = fleet_doc()
    doc["pd"] = pd
    # an H100 pool: on L4 and L40S no co-located Phi-4 replica meets its SLO once the chunk and the
    # decode batch each take their own weight pass (atoll.solvers.perf.mixed_step_seconds)
    doc["regions"][0]["gpu_types"].append("H100")
    doc["availability"]["static"]["aws:us-east-2/1xH100"] = 4
    path = folder / "fleet.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_the_fleet_files_pd_reaches_the_simulator_and_the_controller(tmp_path: Path) -> None:
    path = _fleet(tmp_path, {"default": "auto", "Acme-8B": "disaggregated"})
    fleet = read_fleet(path)
    assert (fleet.scenario.pd, fleet.scenario.model_pd) == ("auto", (("Acme-8B", "disaggregated"),))
    config = fleet_config(fleet, (2, 3))
    assert config.scenario_spec.pd == "auto"
    live = load_fleet_file(path)
    phases = {(t.service.model, t.service.phase.value) for t in live.templates.values()}
    assert ("Phi-4-14B", "colocated") in phases and ("Acme-8B", "colocated") not in phases
    assert ("Acme-8B", "prefill") in phases
    # --pd overrides the file for every model
    apart = load_fleet_file(path, pd="disaggregated")
    assert not any(t.colocated for t in apart.templates.values())
    both = load_fleet_file(path, pd="aggregated")
    assert all(t.colocated for t in both.templates.values())
