"""``atoll tune``: the rule a fleet should run, chosen on its own history, as a file a person can
read, diff and keep in version control.

**The search.** The rule family with the levers (:class:`~atoll.training.contest.ContestSettings`:
intervals, planning levels, threshold bands, the risk menu of headroom / spread / on-demand floor)
runs on the validation days; the best uniform rule (least effective cost: node $ + the price of
a million tokens lost) and the per-model assignment (coordinate descent over the same options,
:mod:`atoll.training.per_model`) are chosen there and nowhere else. Then both, and the plain
``fixed:1@0.9`` baseline, run on the later test days on paired seeds (the same demand,
preemptions and availability for each), and the file carries those figures as its evidence: what
the choice costs on days it did not see, against the baseline, with a 95% interval over seeds.

**Learned candidates.** A learned policy trained for the fleet competes on the same validation days
(:func:`learned_candidates`: by default the shipped policy files trained on this fleet, market and
world, and the fleet's registered ``champion`` where an MLflow store holds one; ``--learned``
names others). It is chosen only if its effective cost there beats the chosen rule's; its
validation figures are in the evidence either way.

**The file** (YAML, :class:`TunedPolicy`): ``policy`` is the chosen spec every command takes
(``per-model:...`` or a uniform ``fixed:K@q+RISK``), ``models`` the same per model, then the
world, the fleet, the days and seeds, the data (workload, forecaster) and the evidence. Any
command that takes ``--policy`` (``simulate``, ``evaluate --policies``, ``control``) accepts the
file's path and runs its ``policy``.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import yaml

from atoll.envs import WORLDS, world_of
from atoll.envs.config import FleetConfig
from atoll.envs.vocabulary import PolicySpec, parse_policy
from atoll.solvers.errors import InputError
from atoll.training.contest import (
    REFERENCE,
    REFERENCE_RULE,
    ContestSettings,
    contest_env,
    policy_index,
    run_rules,
    validation_choices,
    validation_grid,
)
from atoll.training.lever_oracle import paired_ratio
from atoll.training.per_model import option_name
from atoll.training.policy_file import read_card
from atoll.training.registry import fleet_name

KIND = "atoll-policy"
FORMAT = 1
SUFFIXES = (".yaml", ".yml")
SHIPPED_POLICIES = Path(__file__).resolve().parent / "policies"
# the settings a world fixes (its observation aside): a learned policy competes in the world it met
WORLD_SETTINGS = tuple(sorted({k for w in WORLDS.values() for k in w} - {"observation"}))


@dataclass(frozen=True)
class TunedPolicy:
    """A tuned policy and the evidence it was chosen on (module docstring); ``source``: the path it
    was read from (:func:`read_tuned`; what results name it by), not part of the file."""

    policy: PolicySpec
    models: dict[str, str]
    world: str
    scenario: str
    availability: str
    workload: str
    forecaster: str
    validation_days: tuple[int, int]
    validation_seeds: int
    test_days: tuple[int, int]
    seeds: int
    lost_usd_per_mtok: float
    evidence: dict[str, Any] = field(default_factory=dict)
    command: str = ""
    created: str = ""
    source: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.policy, PolicySpec):
            raise InputError(f"TunedPolicy: field 'policy' must be a policy spec, got {self.policy!r}")
        if not isinstance(self.models, dict) or not self.models:
            raise InputError(f"TunedPolicy: field 'models' must map each model to its entry, "
                             f"got {self.models!r}")

    def as_dict(self) -> dict[str, Any]:
        return {"kind": KIND, "format": FORMAT, "policy": str(self.policy), "models": dict(self.models),
                "world": self.world, "scenario": self.scenario, "availability": self.availability,
                "workload": self.workload, "forecaster": self.forecaster,
                "chosen_on": {"days": list(self.validation_days), "seeds": self.validation_seeds},
                "reported_on": {"days": list(self.test_days), "seeds": self.seeds},
                "lost_usd_per_mtok": self.lost_usd_per_mtok, "evidence": self.evidence,
                "command": self.command, "created": self.created}

    def write(self, path: Path) -> Path:
        from atoll.solvers.files import atomic_write_text

        header = ("# atoll tune: the rule this fleet runs, chosen on the validation days, reported on the\n"
                  "# test days. Any --policy takes this file; `policy` is what runs.\n")
        atomic_write_text(path, header + yaml.safe_dump(self.as_dict(), sort_keys=False, width=100))
        return path


def is_policy_file(spec: object) -> bool:
    return isinstance(spec, str | Path) and Path(str(spec)).suffix in SUFFIXES


def read_tuned(path: Path | str) -> TunedPolicy:
    """The tuned policy at ``path``; an InputError naming the file and what is wrong (a policy spec
    that does not parse: the vocabulary's own error, naming the spec). A file reader: its policy
    text is parsed here, into the :class:`~atoll.envs.vocabulary.PolicySpec` everything past it takes."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"policy file {p} not found; write one with `atoll tune --out {p}`")
    try:
        doc = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        raise InputError(f"policy file {p}: not YAML ({exc})") from exc
    if not isinstance(doc, dict) or doc.get("kind") != KIND:
        raise InputError(f"policy file {p}: not an atoll policy (its 'kind' must be {KIND!r}); write one "
                         f"with `atoll tune`")
    if doc.get("format") != FORMAT:
        raise InputError(f"policy file {p}: format {doc.get('format')!r}, this atoll reads format {FORMAT}")
    malformed = f"policy file {p}: field {{}} missing or malformed; write it again with `atoll tune`"
    try:
        text = str(doc["policy"])
        if not text.strip():
            raise InputError(f"TunedPolicy: field 'policy' must be a policy spec, got {text!r}")
    except (KeyError, ValueError) as exc:
        raise InputError(malformed.format(exc)) from exc
    policy = parse_policy(text)
    try:
        return TunedPolicy(
            policy=policy, models={str(k): str(v) for k, v in dict(doc["models"]).items()},
            world=str(doc["world"]), scenario=str(doc["scenario"]), availability=str(doc["availability"]),
            workload=str(doc["workload"]), forecaster=str(doc["forecaster"]),
            validation_days=tuple(doc["chosen_on"]["days"]), validation_seeds=int(doc["chosen_on"]["seeds"]),
            test_days=tuple(doc["reported_on"]["days"]), seeds=int(doc["reported_on"]["seeds"]),
            lost_usd_per_mtok=float(doc["lost_usd_per_mtok"]), evidence=dict(doc.get("evidence") or {}),
            command=str(doc.get("command", "")), created=str(doc.get("created", "")), source=str(path))
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(malformed.format(exc)) from exc


def _figures(rows: Sequence[Mapping[str, float]], lost: float) -> dict[str, Any]:
    eff = [r["cost_usd"] + lost * max(r["demand_tokens"] - r["goodput_tokens"], 0.0) / 1e6 for r in rows]
    n = len(rows)
    return {"cost_usd": round(sum(r["cost_usd"] for r in rows) / n, 2),
            "slo_attainment": round(sum(r["slo_attainment"] for r in rows) / n, 4),
            "effective_usd": round(sum(eff) / n, 2), "effective_usd_per_seed": [round(v, 2) for v in eff]}


def _entries(spec: PolicySpec, models: tuple[str, ...]) -> dict[str, str]:
    """Each model's entry of ``spec`` (``K@q[+RISK]`` of a per-model assignment; a uniform rule's spec)."""
    if spec.kind == "per-model":
        return {m: option_name(e).removeprefix("fixed:") for m, e in zip(models, spec.entries, strict=True)}
    return dict.fromkeys(models, str(spec))


def learned_candidates(config: FleetConfig, given: str | Sequence[PolicySpec] = "auto", *,
                       shipped: Path = SHIPPED_POLICIES) -> list[PolicySpec]:
    """The learned policies ``tune`` tries for ``config``'s fleet: ``none``; ``auto`` — every policy
    file under ``shipped`` trained on this fleet, market and world (the world's settings as its card
    records them), and ``learned:champion`` when the MLflow store (``$MLFLOW_TRACKING_URI``, else
    ``mlruns/mlflow.db`` if it exists) holds a champion for the fleet; or the ``learned:`` specs
    given."""
    if given == "none":
        return []
    if isinstance(given, str) and given != "auto":
        raise InputError(f"--learned {given!r}: give learned:... specs (learned:file:FOLDER, "
                         f"learned:champion), 'auto' or 'none'")
    if not isinstance(given, str):
        for spec in given:
            if not spec.is_learned:
                raise InputError(f"--learned {str(spec)!r}: give learned:... specs (learned:file:FOLDER, "
                                 f"learned:champion), 'auto' or 'none'")
        return list(given)
    fleet = fleet_name(config.scenario, config.models, config.scenario_spec.models)
    out = []
    for folder in sorted(shipped.iterdir()) if shipped.is_dir() else []:
        try:
            card = read_card(folder)
        except InputError:
            continue  # not a policy file
        same_world = all(card.world.get(f"env.{k}") == str(getattr(config, k)) for k in WORLD_SETTINGS)
        if card.fleet == fleet and card.availability == config.availability and same_world:
            out.append(PolicySpec("learned", uri=f"file:{_shown(folder)}"))
    if _has_champion(fleet):
        from atoll.training.registry import champion_uri

        out.append(PolicySpec("learned", uri=champion_uri(fleet).removeprefix("models:/")))
    return out


def _shown(folder: Path) -> str:
    """``folder`` relative to the working directory where it lies below it (a file stays portable)."""
    try:
        return str(folder.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(folder.resolve())


def _has_champion(fleet: str) -> bool:
    """Whether an MLflow store that exists holds ``atoll-trigger-<fleet>@champion`` (none is made)."""
    if not (os.environ.get("MLFLOW_TRACKING_URI") or Path("mlruns/mlflow.db").is_file()):
        return False
    from atoll.training.registry import champion_uri
    from atoll.training.tracking import configure
    from atoll.training.train_tracking import registered_version

    configure()
    try:
        return registered_version(champion_uri(fleet)) is not None
    except Exception:  # noqa: BLE001 - an unreachable or foreign store: no champion to try
        return False


def _learned_config(config: FleetConfig, spec: PolicySpec, n_models: int) -> FleetConfig:
    """``config`` observing what the learned policy ``spec`` was trained to observe."""
    from atoll.training.evaluate import resolve_policy

    policy = resolve_policy(spec, n_models, configurable=True)
    card = getattr(policy, "card", None)
    observation = card.observation if card is not None else \
        {"atoll/Fleet-v3": "v3", "atoll/Fleet-v4": "v3", "atoll/Fleet-v2": "v2"}.get(
            str(getattr(policy, "metadata", {}).get("env_id")), "v1")
    return dataclasses.replace(config, observation=observation)


def tune(config: FleetConfig, settings: ContestSettings, *, command: str = "",
         tick: Callable[[int], None] | None = None, now: datetime.datetime | None = None,
         learned: Sequence[PolicySpec] = ()) -> TunedPolicy:
    """Choose on the validation days, report on the test days (module docstring); ``learned``:
    the learned candidates (:func:`learned_candidates`)."""
    st = settings
    # the contest's pieces, not the contest: only the chosen policy, the best uniform rule and the
    # baseline run on the test days (the contest also runs the whole frontier: 2-3x the time)
    config, base = contest_env(config, st)
    validation, grid_seconds = validation_grid(config, st, tick=tick)
    lost = st.lost_price(config)
    _, best, per_model = validation_choices(validation, len(base.models), st, lost)
    # results are keyed by name (str(spec)); the policies they name, to run them again
    index = policy_index(st, per_model, REFERENCE, *learned)
    chosen = per_model[2] if per_model is not None else best
    points = per_model[3] if per_model is not None else {}
    models = tuple(base.models)
    val: dict[str, Any] = {}
    for name in (chosen, best, REFERENCE_RULE):
        if name in validation:
            val[name] = _figures(validation[name], lost)
        elif name in points:
            pt = points[name]
            val[name] = {"cost_usd": round(pt.cost_usd, 2), "slo_attainment": round(pt.slo_attainment, 4),
                         "effective_usd": round(pt.effective_cost(lost), 2)}
    vdays = list(range(st.validation_days[0], st.validation_days[1] + 1))
    configs: dict[str, FleetConfig] = {}
    for spec in learned:  # each on the validation days, in the world it observes
        name = str(spec)
        configs[name] = _learned_config(config, spec, len(models))
        runs = run_rules(configs[name], [spec], vdays, st.validation_seeds or st.seeds, st.workers, False,
                         tick, ray_address=st.ray_address)
        val[name] = _figures(cast(list[dict[str, float]], runs[name]), lost)
        if val[name]["effective_usd"] < val[chosen]["effective_usd"]:
            chosen = name
    rules = list(dict.fromkeys([chosen, best, REFERENCE_RULE]))
    tdays = list(range(st.test_days[0], st.test_days[1] + 1))
    t0 = time.perf_counter()
    plain = [index[r] for r in rules if r not in configs]
    runs = run_rules(config, plain, tdays, st.seeds, st.workers, False, tick, ray_address=st.ray_address)
    if chosen in configs:
        runs.update(run_rules(configs[chosen], [index[chosen]], tdays, st.seeds, st.workers, False, tick,
                              ray_address=st.ray_address))
    test_seconds = time.perf_counter() - t0
    test = {name: _figures(cast(list[dict[str, float]], runs[name]), lost) for name in rules}
    baseline = test[REFERENCE_RULE]["effective_usd_per_seed"]
    against = {name: paired_ratio(t["effective_usd_per_seed"], baseline) if len(baseline) > 1
               else {"mean": t["effective_usd"] / test[REFERENCE_RULE]["effective_usd"]}
               for name, t in test.items() if name != REFERENCE_RULE}
    evidence = {"chosen": chosen, "best_uniform_rule": best, "baseline": REFERENCE_RULE,
                "learned_candidates": [str(s) for s in learned],
                "grid_rules": len(validation), "validation": val, "test": test,
                "effective_cost_vs_baseline": _clean(against),
                "seconds": {"grid": round(grid_seconds, 1), "test": round(test_seconds, 1)}}
    c = config
    when = (now or datetime.datetime.now(datetime.UTC)).isoformat(timespec="seconds")
    return TunedPolicy(
        policy=index[chosen], models=_entries(index[chosen], models), world=world_of(c), scenario=c.scenario,
        availability=c.availability, workload=c.workload, forecaster=c.forecaster,
        validation_days=st.validation_days, validation_seeds=st.validation_seeds or st.seeds,
        test_days=st.test_days, seeds=st.seeds, lost_usd_per_mtok=lost, evidence=evidence, command=command,
        created=when)


def _clean(value: Any) -> Any:
    """Plain floats for YAML (no numpy scalars, no NaN)."""
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    if isinstance(value, bool | str | int) or value is None:
        return value
    f = float(value)
    return round(f, 5) if math.isfinite(f) else None
