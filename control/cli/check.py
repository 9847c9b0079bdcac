"""``atoll check --fleet FILE``: load a fleet file and every log it names, and say what was read
and corrected before any command acts on it (like ``promtool check config``).

Per model: its workload, the span of its data, rows, mean rate (gaps left out, and counted as
zero), the scaling applied, gaps, copied rows and stray rows dropped, and whether any offered
node can serve it; then every warning the other commands would give. Exit 0 when the fleet is
usable as it is (warnings are corrections, said), 2 on an error (a broken file, or a model no
template can serve).
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

from rich.table import Table

from atoll.control.cli.common import add_json
from atoll.control.cli.output import output_for
from atoll.envs.fleet_file import ActiveFleet, activate, data_span


class _Collect(logging.Handler):
    """Warnings the loaders log while the fleet is activated, kept for the report."""

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
        active = activate(path)
    finally:
        root.removeHandler(handler)
    return _document(active, handler.messages, templates)


def _document(active: ActiveFleet, warnings: list[str], templates: bool) -> dict[str, Any]:
    spec = active.spec
    checks = dict(active.model_checks)
    scalings = dict(active.scalings)
    rates = dict(active.mean_rates)
    reasons: dict[str, str] = {}
    errors: list[str] = []
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
        "ok": not errors, "models": models, "files": [c.to_json() for c in active.checks],
        "warnings": warnings, "errors": errors,
    }


def cmd_check(args: argparse.Namespace) -> int:
    out = output_for(args)
    doc = check_fleet(args.fleet, templates=not args.no_templates)
    table = Table(title=f"{doc['name']} ({doc['fleet']}): {doc['days']} whole days, runtime {doc['runtime']}")
    for col in ("model", "span", "rows", "mean req/s", "scaling", "gaps", "copies", "stray", "servable"):
        table.add_column(col, justify="right" if col in ("rows", "mean req/s", "gaps", "copies", "stray")
                         else "left")
    for m in doc["models"]:
        gaps = m.get("gaps")
        table.add_row(m["model"], m["span"], str(m.get("rows", "-")),
                      "-" if m["mean_rate_planned"] is None else f"{m['mean_rate_planned']:.4g}",
                      m["scaling"],
                      "-" if gaps is None else f"{len(gaps)} ({sum(g['hours'] for g in gaps):.1f} h)",
                      str(m.get("copied_rows_dropped", "-")), str(m.get("isolated_rows_dropped", "-")),
                      "yes" if m["servable"] else "NO")
    out.result(table)
    for w in doc["warnings"]:
        out.result(f"warning: {w}")
    for e in doc["errors"]:
        out.result(f"error: {e}")
    out.result("ok" if doc["ok"] else "errors: the fleet cannot be used as it is")
    out.json(doc)
    return 0 if doc["ok"] else 2


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("check", help="load a fleet file and every log it names; report what was read")
    p.add_argument("--fleet", required=True, metavar="FILE", help="the fleet file (or core, extended)")
    p.add_argument("--no-templates", action="store_true",
                   help="skip building the template library (servability is then not checked)")
    add_json(p)
    p.set_defaults(handler=cmd_check)

