"""Ship the policy behind a published contest cell: copy its policy file into
``training/policies/<cell>/`` with a README that gives the figure it produced and the command that
re-evaluates it (prints one JSON document: what was shipped, where, its size).

    .venv/bin/python benchmarks/ship_policy.py benchmarks/results/policy_core_exact_shipped.json \
        core/spot/exact [--into training/policies] [--as FOLDER]

The cell must come from ``benchmarks/policy.py`` run with a run folder (its ``policy_file``). The
README's re-evaluation command is the cell's own command with ``--policy-file`` in place of the
training, so the same contest runs on the shipped file (add ``--seeds N`` for more seeds).
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any

# Run as a script, this file's folder leads sys.path and its name would shadow the package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

from atoll.training.policy_file import CARD, MODEL, NORMALIZATION, read_card  # noqa: E402

# the options of benchmarks/policy.py that only concern training (dropped from the re-evaluation)
TRAINING_ONLY = {"timesteps", "checkpoint_every", "run_dir", "bootstrap_steps", "bootstrap_epochs",
                 "bootstrap_min_updates", "bootstrap_smoothing", "n_envs", "demand_seeds", "eval_every",
                 "patience", "ent_coef", "learning_rate", "normalize_observations", "n_steps", "batch_size",
                 "learned_run", "policy_file", "out", "into", "merge", "grid_only", "no_learned",
                 "train_days"}


def reevaluation_command(settings: dict[str, Any], folder: str, seeds: int | None = None) -> str:
    """``benchmarks/policy.py`` with the cell's contest options and ``--policy-file folder``."""
    words = [".venv/bin/python", "benchmarks/policy.py"]
    for key, value in settings.items():
        if key in TRAINING_ONLY or key == "grid" or value is None or value is False:
            continue
        if key == "seeds" and seeds is not None:
            value = seeds
        option = "--" + key.replace("_", "-")
        words += [option] if value is True else [option, str(value)]
    return shlex.join([*words, "--policy-file", folder])


def ship(doc_path: Path, key: str, into: Path, name: str | None = None) -> dict[str, Any]:
    doc = json.loads(doc_path.read_text())
    if key not in doc:
        cells = ", ".join(k for k in doc if k != "settings")
        raise SystemExit(f"{doc_path}: no cell {key!r}; cells: {cells}")
    cell = doc[key]
    scenario, availability, world = key.split("/")[:3]
    # the document may hold several cells: the command re-evaluates this one
    settings = {**doc["settings"], "scenarios": scenario, "availabilities": availability,
                "worlds": world.split(" ")[0]}
    source = cell.get("policy_file")
    if not source:
        raise SystemExit(f"{doc_path} {key}: no policy_file (run benchmarks/policy.py with a run folder)")
    name = name or key.replace("/", "-")
    target = into / name
    card = read_card(Path(source))
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    for part in (CARD, MODEL, NORMALIZATION):
        if (Path(source) / part).is_file():
            shutil.copyfile(Path(source) / part, target / part)
    shown = f"training/policies/{name}"
    head = cell["headline"]
    readme = f"""# `{key}`: the learned policy of the published contest cell

Env `{card.env_id}` ({card.action}, {len(card.action_codes)} codes per model), fleet `{card.fleet}`
({', '.join(card.models)}), market `{card.availability}`; trained on days
{card.train_days[0]}-{card.train_days[1]} ({card.demand_seeds} demand realizations, data hash
`{card.data_hash}`), {card.bootstrap_steps} cloning observations then PPO; the kept parameters
had taken {card.steps} PPO steps (validation score {card.validation_score}). Made by:

```bash
{card.command}
```

Its figure (test days {settings['test_days']}, {settings['seeds']} seeds, `{doc_path.as_posix()}`,
key `{key}`):
`frontier_cost_ratio` {head['frontier_cost_ratio']['mean']:.3f} ± {head['frontier_cost_ratio']['std']:.3f},
`effective_cost_ratio` {head['effective_cost_ratio']['mean']:.3f} ± {head['effective_cost_ratio']['std']:.3f},
cost ${head['cost_usd']['mean']:,.0f} ± {head['cost_usd']['std']:,.0f} at SLO attainment
{head['slo_attainment']['mean']:.4f} ± {head['slo_attainment']['std']:.4f}.

Re-evaluate it (the same contest on this file; raise `--seeds` for more):

```bash
{reevaluation_command(settings, shown)}
```

Or use it anywhere a policy goes: `--policy learned:file:{shown}` (`atoll evaluate --policies`,
`atoll control --policy`, `atoll demo --policy`), on a fleet with the same env id and observation.
"""
    (target / "README.md").write_text(readme)
    return {"cell": key, "shipped": str(target), "from": source,
            "bytes": sum(p.stat().st_size for p in target.iterdir())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("document", type=Path, help="a JSON document benchmarks/policy.py wrote (--out)")
    parser.add_argument("cells", nargs="+", help="cell keys to ship, e.g. core/spot/exact")
    parser.add_argument("--into", type=Path, default=Path("training/policies"))
    parser.add_argument("--as", dest="name", help="the folder name under --into (one cell only), for a cell "
                        "whose key another shipped policy already holds, e.g. core-spot-charged-1728")
    args = parser.parse_args()
    if args.name and len(args.cells) != 1:
        parser.error(f"--as {args.name} names one folder, but {len(args.cells)} cells were given: "
                     f"ship them one by one")
    print(json.dumps([ship(args.document, key, args.into, args.name) for key in args.cells], indent=2))


if __name__ == "__main__":
    main()
