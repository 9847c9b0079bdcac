"""A learned preset chooser against the per-model rule and the rule switched by preemptions, where
the room is: one JSON document on stdout (progress on stderr), one key per cell in ``--out``.

Per cell (``--cells``, as in ``benchmarks/room.py``; its ``room.json`` names the per-model rule,
and ``benchmarks/switched.py``'s run folder holds the switched rule's test seeds):

1. **Learn on training days 4-7** (``--train-seeds`` seeds): the per-model rule and each preset
   run uniformly; the contexts and each preset's relative gain over the next ``--horizon`` steps
   (:mod:`atoll.training.preset_bandit`); ridge heads fitted on them.
2. **Choose on validation days 8-10** (``--validation-seeds`` seeds): the margin (how much
   predicted gain a departure from the per-model rule needs) of least effective cost, beside the
   per-model rule on the same seeds.
3. **Report on test days 11-14**: the chosen policy on ``--seeds`` seeds, paired with the per-model
   rule (the room's and the switched contest's stored figures for the same seeds) and with the
   switched rule on the same seeds. Every run starts from the per-model rule's first plan.

Each finished piece is kept in ``--run-dir`` (a stopped run resumes); the learned heads are saved
there as ``bandit.json``.

    .venv/bin/python benchmarks/bandit.py --cells core/hedged/charged --workers 1
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

# Run as a script, this file's folder leads sys.path and its name would shadow the package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import numpy as np  # noqa: E402

from atoll.envs import WORLDS  # noqa: E402
from atoll.envs.config import FleetConfig  # noqa: E402
from atoll.envs.fleet_env import FleetEnv  # noqa: E402
from atoll.envs.vocabulary import parse_policy  # noqa: E402
from atoll.solvers.files import atomic_write_text  # noqa: E402
from atoll.training.contest import ContestSettings  # noqa: E402
from atoll.training.evaluate import env_at_level, resolve_policy, seed_value  # noqa: E402
from atoll.training.lever_oracle import measured, paired_ratio, preset_of  # noqa: E402
from atoll.training.preset_bandit import (  # noqa: E402
    BanditData,
    LinearHeads,
    PresetBandit,
    collect,
    context_layout,
    fit,
    reference_options,
    save,
)
from atoll.training.switched_rule import Signal, SwitchedRule, uniform  # noqa: E402

PRESETS = ("fixed:1@0.9", "fixed:1@0.9+h0.85", "fixed:1@0.9+h0.7")
TRAIN_DAYS = [4, 5, 6, 7]
VALIDATION_DAYS = [8, 9, 10]
TEST_DAYS = [11, 12, 13, 14]
KEYS = ("effective_usd", "cost_usd", "slo_attainment")


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def cell_config(key: str, first_day: int) -> FleetConfig:
    """The cell's env over ``first_day``-14 (the validation and test runs: 8-14, as the room's and
    the switched contest's, so the stored figures pair)."""
    parts = key.split("/")
    scenario, availability, world = parts[:3]
    workload = f"servegen-{parts[3]}" if len(parts) > 3 else "servegen"
    # a replica per phase, as the room's and the switched contest's cells it pairs with were measured
    return FleetConfig(scenario=scenario, availability=availability, workload=workload, pd="disaggregated",
                       action_levels=(0.9,),
                       days=(first_day, TEST_DAYS[-1]), **WORLDS[world])


def train_job(config: FleetConfig, per_model: str, seed: int, horizon: int, lost: float, out: Path) -> int:
    """One training seed's rows, saved to ``out`` (npz)."""
    env = FleetEnv(config)
    n = len(env.models)
    reference = resolve_policy(parse_policy(per_model), n)
    arms = [resolve_policy(parse_policy(p), n) for p in PRESETS]
    cache: dict[Any, FleetEnv] = {}
    contexts, gains = collect(env, reference, arms, days=TRAIN_DAYS, seed=seed_value(seed), horizon=horizon,
                              lost_usd_per_mtok=lost, env_for=lambda p: env_at_level(env, p, cache))
    np.savez_compressed(out, contexts=contexts, gains=gains)
    return seed


def bandit(env: FleetEnv, heads: LinearHeads, per_model: str, margin: float, hold: int) -> PresetBandit:
    n = len(env.models)
    reference = resolve_policy(parse_policy(per_model), n)
    columns, _ = context_layout(env.feature_names, env.models)
    return PresetBandit(tuple(preset_of(parse_policy(p)) for p in PRESETS),
                        reference_options(parse_policy(per_model), n), heads, columns, margin=margin,
                        hold=hold, name=f"preset-bandit(margin={margin:g})",
                        first=(reference.planning_quantile, reference.risk))


SWITCHED = re.compile(r"switched\((.+) -> (.+) when since_preempt<=([0-9.e+-]+)\)")


def switched_rule(name: str, per_model: str, n_models: int) -> SwitchedRule:
    """The switched contest's chosen rule from its name (``benchmarks/switched.py``'s grid: one calm
    and one alert preset for every model, started from the per-model rule's first plan)."""
    match = SWITCHED.fullmatch(name)
    if match is None:
        raise SystemExit(f"cannot read the switched rule {name!r}; expected {SWITCHED.pattern}")
    calm, alert, threshold = match.groups()
    reference = resolve_policy(parse_policy(per_model), n_models)
    signal = Signal("since_preempt", float(threshold))
    return uniform(preset_of(parse_policy(calm)), preset_of(parse_policy(alert)), signal, n_models, name=name,
                   first=(reference.planning_quantile, reference.risk))


def run_job(config: FleetConfig, heads_doc: dict[str, Any] | None, per_model: str, margin: float, hold: int,
            days: list[int], seed: int, lost: float, switched: str | None = None
            ) -> tuple[float, int, dict[str, Any]]:
    """The bandit at ``margin`` (without heads: the per-model rule, or the switched rule named
    ``switched``) on one seed."""
    env = FleetEnv(config)
    if switched is not None:
        policy: Any = switched_rule(switched, per_model, len(env.models))
    elif heads_doc is None:
        policy = resolve_policy(parse_policy(per_model), len(env.models))
    else:
        policy = bandit(env, LinearHeads.from_dict(heads_doc), per_model, margin, hold)
    _, totals = measured(env, policy, days=days, seed=seed, lost_usd_per_mtok=lost)
    if heads_doc is not None:
        chosen = np.stack(policy.choices)
        totals["departures"] = float((chosen > 0).mean())
        totals["arm_shares"] = np.bincount(chosen.ravel(), minlength=len(PRESETS) + 1).tolist()
    return margin, seed, totals


Rows = list[dict[str, Any]]


def stored_references(key: str, args: argparse.Namespace) -> tuple[Rows, Rows, str]:
    """The per-model rule's and the switched rule's test rows per seed (the switched contest's
    folder: the room's seeds first, then those it ran), and the switched rule's name."""
    folder = args.switched_dir / key.replace("/", "-")
    test = json.loads((folder / "test.json").read_text())
    if not test["check"].get("reproduces", True):
        raise SystemExit(f"{folder}/test.json: the room's per-model rule did not reproduce there; pair by "
                         f"running it here instead")
    room_dir = args.room_dir / key.replace("/", "-")
    room_doc = json.loads(args.room_out.read_text())[key]
    ref, switched = [], []
    for k in range(args.seeds):
        if str(k) in test["reference"]:
            ref.append(test["reference"][str(k)])
        elif (p := room_dir / f"seed-{k}.json").exists():
            ref.append(json.loads(p.read_text())["per_model_rule"])
        else:
            ref.append(room_doc["per_seed"][k]["per_model_rule"])
        switched.append(test["runs"][str(k)])
    return ref, switched, str(test["chosen"])


def run_cell(key: str, args: argparse.Namespace) -> dict[str, Any]:
    folder = args.run_dir / key.replace("/", "-")
    folder.mkdir(parents=True, exist_ok=True)
    config, train_config = cell_config(key, VALIDATION_DAYS[0]), cell_config(key, TRAIN_DAYS[0])
    lost = ContestSettings(validation_days=(8, 10), test_days=(11, 14)).lost_price(config)
    FleetEnv(train_config)  # the demand and forecast caches, once, before the workers read them
    env = FleetEnv(config)
    per_model = json.loads(args.room_out.read_text())[key]["per_model_rule"]
    ref_rows, switched_rows, switched_name = stored_references(key, args)  # fail early, before any run
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        files = [folder / f"train-seed-{s}-h{args.horizon}.npz" for s in range(args.train_seeds)]
        futures = [pool.submit(train_job, train_config, per_model, s, args.horizon, lost, f)
                   for s, f in enumerate(files) if not f.exists()]
        for f in futures:
            log(f"{key}: training seed {f.result()} collected")
        loaded = [np.load(f) for f in files]
        _, features = context_layout(env.feature_names, env.models)
        data = BanditData(np.concatenate([d["contexts"] for d in loaded]),
                          np.concatenate([d["gains"] for d in loaded]), tuple(features))
        heads = fit(data, alpha=args.alpha)
        heads_doc = heads.to_dict()
        log(f"{key}: heads fitted on {len(data.gains)} rows; mean gain per arm "
            f"{np.round(data.gains.mean(axis=0), 4).tolist()}")
        vfile = folder / "validation.json"
        validation: dict[str, dict[str, Any]] = json.loads(vfile.read_text()) if vfile.exists() else {}
        margins = [float(m) for m in args.margins.split(",")]
        vseeds = range(args.validation_seeds)
        todo = [(m, s) for m in [*margins, None] for s in vseeds
                if str(s) not in validation.get("rule" if m is None else f"{m:g}", {})]
        futures = [pool.submit(run_job, config, None if m is None else heads_doc, per_model, m or 0.0,
                               args.horizon, VALIDATION_DAYS, s, lost) for m, s in todo]
        for (m, _), f in zip(todo, futures, strict=True):
            _, seed, totals = f.result()
            validation.setdefault("rule" if m is None else f"{m:g}", {})[str(seed)] = totals
            atomic_write_text(vfile, json.dumps(validation, indent=1) + "\n")
            log(f"{key}: validation {'rule' if m is None else f'margin {m:g}'} seed {seed}: "
                f"${totals['effective_usd']:.0f}")
        v_cost = {k: float(np.mean([validation[k][str(s)]["effective_usd"] for s in vseeds]))
                  for k in validation}
        chosen = min((f"{m:g}" for m in margins), key=lambda k: v_cost[k])
        log(f"{key}: margin chosen on validation days: {chosen} (${v_cost[chosen]:.0f}; per-model rule "
            f"${v_cost['rule']:.0f})")
        save(folder / "bandit.json", heads, arms=PRESETS, reference=per_model, margin=float(chosen),
             horizon=args.horizon, env=env, provenance={"cell": key, "train_days": TRAIN_DAYS,
                                               "train_seeds": args.train_seeds, "alpha": args.alpha,
                                               "rows": int(len(data.gains)),
                                               "validation_days": VALIDATION_DAYS})
        tfile = folder / "test.json"
        test: dict[str, Any] = json.loads(tfile.read_text()) if tfile.exists() else {}
        if test.get("margin") not in (None, chosen):
            raise SystemExit(f"{tfile} holds test runs at margin {test['margin']}, not {chosen}; move it "
                             f"away")
        test["margin"] = chosen
        runs = test.setdefault("runs", {})
        if "check" not in test:  # do the stored per-model rule's figures reproduce on this checkout?
            _, _, totals = run_job(config, None, per_model, 0.0, args.horizon, TEST_DAYS, 0, lost)
            test["check"] = {"per_model_rule_seed_0": totals, "stored": ref_rows[0],
                             "reproduces": abs(totals["effective_usd"] - ref_rows[0]["effective_usd"]) < 0.01}
            atomic_write_text(tfile, json.dumps(test, indent=1) + "\n")
            log(f"{key}: the per-model rule, seed 0: ${totals['effective_usd']:.2f} here, "
                f"${ref_rows[0]['effective_usd']:.2f} stored")
        if not test["check"]["reproduces"]:
            # the stored runs came from another solver version: both references run here on every
            # seed, so each pair is one checkout's
            log(f"{key}: the stored figures do not reproduce here (another solver version); the per-model "
                f"and the switched rule run here on every seed")
            here = test.setdefault("references_here", {"per_model_rule": {}, "switched": {}})
            todo_r = [(name, s) for name in ("per_model_rule", "switched") for s in range(args.seeds)
                      if str(s) not in here[name]]
            futures = [pool.submit(run_job, config, None, per_model, 0.0, args.horizon, TEST_DAYS, s, lost,
                                   switched_name if name == "switched" else None) for name, s in todo_r]
            for (name, _), f in zip(todo_r, futures, strict=True):
                _, seed, totals = f.result()
                here[name][str(seed)] = totals
                atomic_write_text(tfile, json.dumps(test, indent=1) + "\n")
                log(f"{key}: {name} (run here) seed {seed}: ${totals['effective_usd']:.0f}")
            ref_rows = [here["per_model_rule"][str(k)] for k in range(args.seeds)]
            switched_rows = [here["switched"][str(k)] for k in range(args.seeds)]
        futures = [pool.submit(run_job, config, heads_doc, per_model, float(chosen), args.horizon, TEST_DAYS,
                               s, lost)
                   for s in range(args.seeds) if str(s) not in runs]
        for f in futures:
            _, seed, totals = f.result()
            runs[str(seed)] = totals
            atomic_write_text(tfile, json.dumps(test, indent=1) + "\n")
            log(f"{key}: test seed {seed}: ${totals['effective_usd']:.0f}")
    rows = [runs[str(k)] for k in range(args.seeds)]
    eff = [r["effective_usd"] for r in rows]
    return {
        "cell": key, "train_days": TRAIN_DAYS, "train_seeds": args.train_seeds, "horizon": args.horizon,
        "alpha": args.alpha, "rows": int(len(data.gains)), "features": list(features),
        "validation_days": VALIDATION_DAYS, "validation_seeds": args.validation_seeds,
        "validation_effective_usd": dict(sorted(v_cost.items(), key=lambda kv: kv[1])), "margin": chosen,
        "test_days": TEST_DAYS, "seeds": args.seeds, "per_model_rule": per_model,
        "means": {name: {k: float(np.mean([r[k] for r in rs])) for k in KEYS} for name, rs in
                  (("bandit", rows), ("per_model_rule", ref_rows), ("switched", switched_rows))},
        "departures": float(np.mean([r["departures"] for r in rows])),
        "arm_shares": np.sum([r["arm_shares"] for r in rows], axis=0).tolist(),
        "bandit_vs_per_model_rule": paired_ratio(eff, [r["effective_usd"] for r in ref_rows]),
        "bandit_vs_switched": paired_ratio(eff, [r["effective_usd"] for r in switched_rows]),
        "switched_vs_per_model_rule": paired_ratio([r["effective_usd"] for r in switched_rows],
                                                   [r["effective_usd"] for r in ref_rows]),
        "references": "stored" if test["check"]["reproduces"] else "run here",
        "time_limited_solves": int(sum(r["time_limited_solves"] for r in rows)),
        "seconds": round(time.perf_counter() - t0, 1), "loadavg": list(os.getloadavg())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", default="core/hedged/charged")
    ap.add_argument("--horizon", type=int, default=12, help="steps a preset's gain is summed over")
    ap.add_argument("--alpha", type=float, default=10.0, help="ridge penalty on standardized contexts")
    ap.add_argument("--margins", default="0,0.02,0.05,0.1")
    ap.add_argument("--train-seeds", type=int, default=3)
    ap.add_argument("--validation-seeds", type=int, default=2)
    ap.add_argument("--seeds", type=int, default=16)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--room-dir", type=Path, default=Path("benchmarks/runs/room"))
    ap.add_argument("--room-out", type=Path, default=Path("benchmarks/results/room.json"))
    ap.add_argument("--switched-dir", type=Path, default=Path("benchmarks/runs/switched"))
    ap.add_argument("--run-dir", type=Path, default=Path("benchmarks/runs/bandit"))
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/bandit.json"))
    args = ap.parse_args()
    doc: dict[str, Any] = json.loads(args.out.read_text()) if args.out.exists() else {}
    for key in args.cells.split(","):
        doc[key] = run_cell(key, args)
        atomic_write_text(args.out, json.dumps(doc, indent=1, default=float) + "\n")
    print(json.dumps(doc, indent=1, default=float))


if __name__ == "__main__":
    main()
