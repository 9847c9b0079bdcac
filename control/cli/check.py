"""``atoll check --fleet FILE``: load a fleet file and every log it names, and say what was read
and corrected before any command acts on it (like ``promtool check config``).

Per model: its workload, the span of its data, rows, mean rate (gaps left out, and counted as
zero), the scaling applied, gaps, copied rows and stray rows dropped, and whether any offered
node can serve it. Per pool the fleet resolved to: region, GPU type, node config, market, $/h of
each tier it sells, caps (static, on-demand quota) and the trace it follows. Then every warning
the other commands would give (a GPU type a region was asked for but does not sell among them).
Exit 0 when the fleet is usable as it is (warnings are corrections, said), 2 on an error (a
broken file, a model no template can serve, or a model with no weights source when the file's
``kubernetes`` section says a Kubernetes sink will deploy it).
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

from rich.table import Table

from atoll.control.cli.common import add_json
from atoll.control.cli.output import output_for
from atoll.envs.availability import SPOT_TRACES
from atoll.envs.fleet_file import Fleet, data_span, read_fleet
from atoll.solvers.scenarios import AMPLE_NODES
from atoll.solvers.tiers import tiers_of

TABLE_WIDTH = 100  # columns a check table may take, redirected or not


class _Collect(logging.Handler):
    """Warnings the loaders log while the fleet is loaded, kept for the report."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if msg not in self.messages:
            self.messages.append(msg)


def check_fleet(path: str, *, templates: bool = True) -> dict[str, Any]:
    """The check document of a fleet file (see the module docstring); AtollError when it cannot
    be loaded at all."""
    handler = _Collect()
    root = logging.getLogger("atoll")
    root.addHandler(handler)
    try:
        active = read_fleet(path)
    finally:
        root.removeHandler(handler)
    return _document(active, handler.messages, templates)


def pools(active: Fleet) -> list[dict[str, Any]]:
    """Every (region, config) the fleet resolved to: its market, each tier's $/node-hour, caps
    and the trace its spot tier follows."""
    spec = active.spec
    static = dict(spec.availability) if spec.availability is not None else None
    traces = dict(spec.pool_traces)
    quota = dict(spec.ondemand_quota or {})
    out = []
    for o in spec.offers:
        cell = (o.region, o.config)
        market = spec.market_of(cell)
        tiers = tiers_of(market)
        if cell in traces:
            cap: int | None = max(traces[cell].nodes)
        elif static is None:
            cap = AMPLE_NODES
        else:
            cap = static.get(cell, 0)
        trace = "-"
        if "spot" in tiers:
            trace = (traces[cell].source if cell in traces
                     else f"bundled:{SPOT_TRACES.get(o.region, 'none').split('_')[0]}")
        out.append({
            "region": o.region, "gpu_type": o.config.split("x", 1)[1], "config": o.config,
            "instance": o.instance, "market": market,
            "on_demand_per_hour": o.on_demand_per_hour if "on-demand" in tiers else None,
            "spot_per_hour": o.price(spot=True) if "spot" in tiers else None,
            "cap": cap, "ondemand_quota": quota.get(cell, AMPLE_NODES) if market == "hedged" else None,
            "trace": trace,
        })
    return out


def _weights_errors(active: Fleet) -> tuple[list[str], list[str]]:
    """(errors, warnings) for models with no weights source: an error when the file's
    ``kubernetes`` section says a Kubernetes sink will deploy them, a warning otherwise."""
    from atoll.control.k8s.render import k8s_options

    spec = active.spec
    options = k8s_options(dict(spec.kubernetes), f"{spec.path}: kubernetes")
    missing = [m for m in spec.model_names if not options.model_sources.get(m)]
    if not missing:
        return [], []
    said = (f"no weights source for {', '.join(missing)}: a Kubernetes sink cannot start vLLM for "
            f"{'it' if len(missing) == 1 else 'them'}; name each model's Hugging Face repository or path "
            f"under kubernetes.model_sources")
    return ([said], []) if spec.kubernetes else ([], [said + " (needed by the k8s: and kubectl: sinks only)"])


def _document(active: Fleet, warnings: list[str], templates: bool) -> dict[str, Any]:
    spec = active.spec
    warnings = [*warnings, *(f"region {r} does not sell {g}: gpu_types asked for it, the fleet has none there"
                             for r, g in spec.unsold)]
    checks = dict(active.model_checks)
    scalings = dict(active.scalings)
    rates = dict(active.mean_rates)
    reasons: dict[str, str] = {}
    errors, weights_warnings = _weights_errors(active)
    warnings += weights_warnings
    if templates:
        from atoll.solvers.scenarios import scenario_templates
        from atoll.solvers.servable import unservable

        # the library of this file's content (the on-disk cache makes a second build a read)
        library = scenario_templates(active.scenario, runtime=spec.runtime)
        reasons = unservable(active.scenario, library, spec.runtime)
        errors += [f"{m} cannot be served: {why}" for m, why in reasons.items()]
    models = []
    for w in spec.workloads:
        mc = checks.get(w.model)
        row: dict[str, Any] = {
            "model": w.model, "source": w.source, "scaling": scalings.get(w.model, "as recorded"),
            "gaps_mode": w.gaps, "mean_rate_planned": rates.get(w.model),
            "span": data_span(active, w.model), "servable": w.model not in reasons,
        }
        if w.model in reasons:
            row["unservable_reason"] = reasons[w.model]
        if mc is not None:
            row.update({k: v for k, v in mc.to_json().items() if k != "model"})
        models.append(row)
    return {
        "fleet": str(spec.path), "name": spec.name, "runtime": spec.runtime, "days": active.days,
        "market": spec.market_summary, "pools": pools(active),
        "ok": not errors, "models": models, "files": [c.to_json() for c in active.checks],
        "warnings": warnings, "errors": errors,
    }


def cmd_check(args: argparse.Namespace) -> int:
    out = output_for(args)
    doc = check_fleet(args.fleet, templates=not args.no_templates)
    table = Table(title=f"{doc['name']} ({doc['fleet']}): {doc['days']} whole days, runtime {doc['runtime']}",
                  width=TABLE_WIDTH)
    for col in ("model", "span", "rows", "mean req/s", "scaling", "gaps", "copies", "stray", "servable"):
        table.add_column(col, justify="right" if col in ("rows", "mean req/s", "gaps", "copies", "stray")
                         else "left", overflow="fold")
    for m in doc["models"]:
        gaps = m.get("gaps")
        table.add_row(m["model"], m["span"].split(",")[0], str(m.get("rows", "-")),
                      "-" if m["mean_rate_planned"] is None else f"{m['mean_rate_planned']:.4g}",
                      m["scaling"],
                      "-" if gaps is None else f"{len(gaps)} ({sum(g['hours'] for g in gaps):.1f} h)",
                      str(m.get("copied_rows_dropped", "-")), str(m.get("isolated_rows_dropped", "-")),
                      "yes" if m["servable"] else "NO")
    out.result(table)
    out.result(_pool_table(doc))
    for w in doc["warnings"]:
        out.result(f"warning: {w}")
    for e in doc["errors"]:
        out.result(f"error: {e}")
    out.result("ok" if doc["ok"] else "errors: the fleet cannot be used as it is")
    out.json(doc)
    return 0 if doc["ok"] else 2


def _pool_table(doc: dict[str, Any]) -> Table:
    table = Table(title=f"Pools ({doc['market']} market; $/node-hour)", width=TABLE_WIDTH)
    for col in ("region", "config", "market", "on-demand", "spot", "cap", "quota", "trace"):
        table.add_column(col, justify="right" if col in ("on-demand", "spot", "cap", "quota") else "left",
                         overflow="fold")

    def money(v: float | None) -> str:
        return "-" if v is None else f"{v:.3f}"

    for p in doc["pools"]:
        table.add_row(p["region"], p["config"], p["market"], money(p["on_demand_per_hour"]),
                      money(p["spot_per_hour"]), str(p["cap"]),
                      "-" if p["ondemand_quota"] is None else str(p["ondemand_quota"]), Path(p["trace"]).name)
    return table


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("check", help="load a fleet file and every log it names; report what was read")
    p.add_argument("--fleet", required=True, metavar="FILE", help="the fleet file (or core, extended)")
    p.add_argument("--no-templates", action="store_true",
                   help="skip building the template library (servability is then not checked)")
    add_json(p)
    p.set_defaults(handler=cmd_check)

