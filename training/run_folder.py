"""A training run's folder: everything the run needs to go on, on this machine or the next.

Layout::

    DIR/
      run.json        what the run is: the env's and PPO's settings (without the budget), the
                      settings key, the command that started it
      status.json     where it stands after its last command: state, steps, budget, scores,
                      its MLflow runs
      checkpoints/    the last checkpoint (:mod:`atoll.training.checkpoint`: model, optimizer,
                      normalization, early stop, clone record, random states, how each env began
                      its episode), replaced atomically every ``checkpoint_every`` steps
      policy-best/    policy files (:mod:`atoll.training.policy_file`) of a finished command: the
      policy-last/    best validation score's parameters, and the last ones

Running the same command again resumes from ``checkpoints/``; a larger ``--timesteps`` continues
the run (the budget is not part of what the run *is*), and so does a larger ``--patience`` after an
early stop. Any other changed setting is refused with the field's name, both values and the fix.
The folder is plain files: copy it to another machine (or commit it) and the run goes on there.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from atoll.solvers.errors import InputError
from atoll.solvers.files import atomic_write_text
from atoll.training import checkpoint as ckpt

RUN_FILE = "run.json"
STATUS_FILE = "status.json"
CHECKPOINTS = "checkpoints"
BEST = "policy-best"
LAST = "policy-last"
FORMAT = 1
# what a run may change between its commands: how long it goes on, not what it is
BUDGET_FIELDS = ("ppo.timesteps", "ppo.patience")


def identity(params: Mapping[str, str]) -> dict[str, str]:
    """A run's settings without its budget: what must match for a command to go on with the run."""
    return {k: str(v) for k, v in sorted(params.items()) if k not in BUDGET_FIELDS}


def default_run_dir(fleet: str, key: str, root: Path | None = None) -> Path:
    """``runs/<fleet>-<key>`` under ``root`` (the working directory): the same command finds the
    same folder, on any machine with the same checkout."""
    return (root or Path("runs")) / f"{fleet}-{key}"


@dataclass(frozen=True)
class RunFolder:
    """An open run folder (made by :meth:`open`)."""

    path: Path
    key: str

    @classmethod
    def open(cls, path: Path, params: Mapping[str, str], key: str, *, command: str) -> RunFolder:
        """Create the folder for a new run, or check that ``params`` are the run's it holds: a
        changed setting (other than :data:`BUDGET_FIELDS`) is an InputError naming each field."""
        path = Path(path)
        wanted = identity(params)
        run_file = path / RUN_FILE
        if run_file.is_file():
            held = _read_json(run_file, "run folder")
            had = held.get("settings")
            if not isinstance(had, dict):
                raise InputError(f"run folder {str(path)!r}: {RUN_FILE} has no 'settings'; start over in "
                                 f"another --run-dir")
            changed = sorted(set(had) | set(wanted))
            changed = [k for k in changed if had.get(k) != wanted.get(k)]
            if changed:
                shown = "; ".join(f"{k}: the run has {had.get(k)!r}, this command {wanted.get(k)!r}"
                                  for k in changed[:6])
                more = f" (and {len(changed) - 6} more)" if len(changed) > 6 else ""
                raise InputError(f"run folder {str(path)!r} holds another run: {shown}{more}; run it with "
                                 f"its own settings (only --timesteps and --patience may change), or "
                                 f"give another --run-dir")
            return cls(path, str(held.get("key", key)))
        if path.exists() and any(path.iterdir()):
            raise InputError(f"run folder {str(path)!r} exists and is not a run folder (no {RUN_FILE}); "
                             f"give an empty or new --run-dir")
        path.mkdir(parents=True, exist_ok=True)
        atomic_write_text(run_file, json.dumps({"format": FORMAT, "key": key, "command": command,
                                                "settings": wanted}, indent=1) + "\n")
        return cls(path, key)

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINTS

    @property
    def best(self) -> Path:
        return self.path / BEST

    @property
    def last(self) -> Path:
        return self.path / LAST

    def checkpoint_spec(self, every: int) -> ckpt.CheckpointSpec:
        return ckpt.CheckpointSpec(self.checkpoints, self.key, every)

    def write_status(self, status: Mapping[str, Any]) -> None:
        """Record where the run stands (atomically: a killed write leaves the previous status)."""
        atomic_write_text(self.path / STATUS_FILE, json.dumps(dict(status), indent=1, default=str) + "\n")


def _read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise InputError(f"{what} {str(path.parent)!r}: {path.name} is unreadable ({exc})") from exc
    if not isinstance(doc, dict):
        raise InputError(f"{what} {str(path.parent)!r}: {path.name} must hold a JSON object")
    return doc


def run_status(path: Path) -> dict[str, Any]:
    """Where the run in ``path`` stands: its state, the steps its last checkpoint holds (and
    whether it resumes exactly), the budget asked last, validation scores, policy files."""
    path = Path(path)
    if not (path / RUN_FILE).is_file():
        raise InputError(f"run folder {str(path)!r}: no {RUN_FILE} (not a run folder); give the --run-dir "
                         f"'atoll train' printed")
    run = _read_json(path / RUN_FILE, "run folder")
    status = _read_json(path / STATUS_FILE, "run folder") if (path / STATUS_FILE).is_file() else {}
    head = ckpt.pointer(path / CHECKPOINTS)
    steps = int(head["steps"]) if head and "steps" in head else 0
    state = status.get("state", "started")
    if state == "running":  # a command that did not end: killed, or still going
        state = "interrupted or running"
    budget = status.get("timesteps")
    policies = {name: str(path / folder) for name, folder in (("best", BEST), ("last", LAST))
                if (path / folder / "card.json").is_file()}
    return {"run_dir": str(path), "key": run.get("key"), "command": run.get("command"), "state": state,
            "checkpoint_steps": steps, "checkpoint_exact": bool(head.get("exact")) if head else None,
            "timesteps": budget, "steps_left": max(int(budget) - steps, 0) if budget is not None else None,
            "validation_scores": status.get("validation_scores", []),
            "validation_best": status.get("validation_best"), "policies": policies,
            "mlflow_runs": status.get("mlflow_runs", []), "updated": status.get("updated")}
