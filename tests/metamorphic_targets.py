"""Metamorphic cases over a seeded request log and fleet file, shared by
tests/test_metamorphic.py and benchmarks/fuzz.py (target ``metamorphic``).

A case is (seed, perturbation). The clean fleet (two models of a three-model log, scaled) is
activated; so is the perturbed one. What ``solve`` and ``simulate`` compute from a fleet is a
deterministic function of what activation gives them — each model's demand series, mean rate
and request shape — so those are compared. A *neutral* perturbation (row order, an extra
column, rows of a model the fleet does not name, the same data as counts, CRLF, ISO times) must
give the same; a *corrupting* one (a stray row, a duplicated key, a unit slip, a log pasted twice)
must give the same or an AtollError naming the line or key. Anything else is a silent misreading.

Only public API is used (``read_fleet``).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from user_models import ACME_8B, models_yaml

T0 = 1714521600  # 2024-05-01T00:00:00Z
DAYS = 2
NEUTRAL = ("shuffle", "extra_column", "unnamed_model", "unnamed_far", "counts", "crlf", "iso")
CORRUPT = ("stray_row", "stray_early", "duplicate_key", "ms_slip", "concatenated", "pasted_chunk",
           "spot_swap")
KINDS = NEUTRAL + CORRUPT
_MODELS = models_yaml(ACME_8B, "Phi-4-14B")  # the user's own Acme-8B and a catalog model


@dataclass
class Outcome:
    kind: str
    result: str  # "same", "error" or "misread"
    detail: str = ""


def _log_rows(rng: np.random.Generator) -> list[tuple[float, str, int, int]]:
    rows = []
    for m, rate in (("acme", 0.02), ("tiny", 0.01)):
        n = int(rate * DAYS * 86400 * rng.uniform(0.8, 1.2))
        # whole seconds: the same requests as per-second counts then start the axis at the same time
        for t in rng.integers(0, DAYS * 86400, n):
            rows.append((T0 + float(t), m, int(rng.integers(20, 2000)), int(rng.integers(5, 500))))
    rows.sort()
    return rows


def _fleet_text(log: str, spot: tuple[float, float] = (3.0, 1.5)) -> str:
    return f"""name: meta
runtime: vllm
models:
{_MODELS}regions:
  - name: lab:rack-1
    offers: [{{config: 2xL40S, on_demand: {spot[0]}, spot: {spot[1]}}}]
workloads:
  Acme-8B: {{source: "csv:{log}#acme", mean_rate: 2.0}}
  Phi-4-14B: {{source: "csv:{log}#tiny", scale: 50}}
"""


def _write_log(path: Path, rows: list[tuple[float, str, int, int]], *, iso: bool = False,
               extra: bool = False, crlf: bool = False) -> None:
    end = "\r\n" if crlf else "\n"
    head = "timestamp,model,input_tokens,output_tokens" + (",request_id" if extra else "")
    lines = [head]
    for i, (t, m, a, b) in enumerate(rows):
        ts = datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z") if iso else repr(t)
        lines.append(f"{ts},{m},{a},{b}" + (f",req-{i}" if extra else ""))
    path.write_text(end.join(lines) + end)


def _write_counts(path: Path, rows: list[tuple[float, str, int, int]]) -> None:
    """The same requests as per-second counts with totals (a second holds the requests that
    arrived in it, so every request keeps its step)."""
    sums: dict[tuple[int, str], list[int]] = {}
    for t, m, a, b in rows:
        # a request at T0 + 12.7 s falls in the second starting at T0 + 12 s: same 5-min step
        k = (int(np.floor(t)), m)
        s = sums.setdefault(k, [0, 0, 0])
        s[0] += 1
        s[1] += a
        s[2] += b
    lines = ["timestamp,model,requests,input_tokens,output_tokens"]
    lines += [f"{t},{m},{n},{a},{b}" for (t, m), (n, a, b) in sorted(sums.items())]
    path.write_text("\n".join(lines) + "\n")


def _summary(fleet: Path) -> dict[str, Any]:
    from atoll.envs.fleet_file import read_fleet

    active = read_fleet(fleet)
    sc = active.scenario
    return {"rates": dict(sc.rates), "shapes": {m: (s.input_tokens, s.output_tokens) for m, s in sc.shapes},
            "series": {s.name: np.asarray(s.requests_per_s) for s in active.series}}


def same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    if set(a["rates"]) != set(b["rates"]):
        return False
    for m in a["rates"]:
        if not np.isclose(a["rates"][m], b["rates"][m], rtol=1e-9):
            return False
        if not np.allclose(a["shapes"][m], b["shapes"][m], rtol=1e-9):
            return False
        x, y = a["series"][m], b["series"][m]
        if len(x) != len(y) or not np.allclose(x, y, rtol=1e-9, atol=1e-12):
            return False
    return True


class MetamorphicTarget:
    """Runs cases; counts outcomes per kind."""

    def __init__(self) -> None:
        self.tried = 0
        self.misread: list[Outcome] = []
        self.errors = 0

    def __call__(self, seed: int, kind: str) -> Outcome:
        from atoll.solvers.errors import AtollError

        self.tried += 1
        rng = np.random.default_rng(seed)
        rows = _log_rows(rng)
        with tempfile.TemporaryDirectory() as tmp:
            d = Path(tmp)
            _write_log(d / "clean.csv", rows)
            (d / "clean.yaml").write_text(_fleet_text("clean.csv"))
            clean = _summary(d / "clean.yaml")
            log, fleet = "log.csv", _fleet_text("log.csv")
            bad = list(rows)
            opts: dict[str, bool] = {}
            if kind == "shuffle":
                bad = [bad[i] for i in rng.permutation(len(bad))]
            elif kind == "extra_column":
                opts["extra"] = True
            elif kind == "crlf":
                opts["crlf"] = True
            elif kind == "iso":
                opts["iso"] = True
            elif kind == "unnamed_model":
                bad += [(T0 + float(t), "other", 10, 10) for t in rng.uniform(0, DAYS * 86400, 50)]
                bad.sort()
            elif kind == "unnamed_far":  # another model's rows, logged a week earlier
                bad = [(T0 - 7 * 86400 + float(t), "other", 10, 10) for t in rng.uniform(0, 3600, 400)] + bad
            elif kind == "stray_row":
                when = float(rng.choice([0.0, 1.0e9, 4.1e9, 9.9e10, T0 + 90 * 86400]))
                at = int(rng.integers(0, len(bad)))
                bad.insert(at, (when, str(rng.choice(["acme", "tiny"])), 100, 10))
            elif kind == "stray_early":  # a canary a month early
                bad.insert(0, (T0 - 30 * 86400, "acme", 100, 10))
            elif kind == "ms_slip":
                at = int(rng.integers(0, len(bad)))
                t, m, a, b = bad[at]
                bad[at] = (t * 1000, m, a, b)
            elif kind == "concatenated":
                bad = bad + bad
            elif kind == "pasted_chunk":
                i = int(rng.integers(0, len(bad) - 20))
                j = i + int(rng.integers(5, 20))
                bad = bad[:j] + bad[i:j] + bad[j:]
            elif kind == "duplicate_key":
                lines = fleet.splitlines()
                dup = str(rng.choice(["runtime: any", "name: other", "    layers: 40",
                                      "  Acme-8B: {source: \"csv:log.csv#tiny\", scale: 1}"]))
                anchor = {"runtime": "runtime:", "name:": "name: meta", "layers": "    layers: 32",
                          "Acme-8B": "  Acme-8B:"}
                key = next(k for k in anchor if k in dup)
                pos = next(i for i, x in enumerate(lines) if x.startswith(anchor[key]))
                lines.insert(pos + 1, dup)
                fleet = "\n".join(lines) + "\n"
            elif kind == "spot_swap":
                fleet = _fleet_text(log, spot=(1.5, 3.0))
            if kind == "counts":
                _write_counts(d / log, bad)
            else:
                _write_log(d / log, bad, **opts)
            (d / "fleet.yaml").write_text(fleet)
            try:
                got = _summary(d / "fleet.yaml")
            except AtollError as exc:
                self.errors += 1
                out = Outcome(kind, "error", str(exc)[:200])
                if kind in NEUTRAL:
                    self.misread.append(Outcome(kind, "misread", f"refused a neutral change: {exc}"[:200]))
                    out.result = "misread"
                return out
            if kind == "spot_swap":
                # prices do not enter the demand: accepted spot above on-demand is the misreading
                out = Outcome(kind, "misread", "spot above on-demand accepted")
            elif kind == "duplicate_key":
                out = Outcome(kind, "misread", "a key given twice was accepted")
            elif same(clean, got):
                out = Outcome(kind, "same")
            else:
                diff = {m: (clean["rates"].get(m), got["rates"].get(m)) for m in clean["rates"]}
                out = Outcome(kind, "misread", f"rates clean vs perturbed {diff}"[:200])
            if out.result == "misread":
                self.misread.append(out)
            return out
