"""The fleet file: one YAML naming a user's models, GPUs, regions and prices, availability,
workloads and cluster settings. Every command takes it (``--fleet FILE``).

.. code-block:: yaml

    name: acme                      # DNS-style name; becomes the scenario name
    runtime: vllm                   # vllm (default) or any, see atoll.solvers.runtime
    models:
      - Phi-4-14B                   # a catalog model, by name or alias
      - name: Acme-8B               # or a full definition (fields of ModelSpec) with its SLO
        layers: 32
        hidden: 4096
        heads: 32
        kv_heads: 8
        head_dim: 128
        params_b: 8.0
        active_params_b: 8.0
        bytes_per_param: 2
        slo: {ttft_ms: 800, tpot_ms: 40}
    gpus:                           # optional: GPU types the catalog lacks (fields of GpuType)
      - {name: MI300X, memory_gb: 192, hbm_bandwidth_gbs: 5300, bf16_tflops: 1307, link_gbs: 448}
    regions:
      - name: aws:us-east-2
        catalog: true               # the catalog's offers and prices in this region ...
        gpu_types: [L4, L40S]       # ... of these GPU types (default: all it sells)
      - name: lab:rack-1            # or your own offers, $/node-hour
        offers:
          - {config: 8xMI300X, on_demand: 28.0, spot: 11.0}
    availability:                   # optional; default: ample (1000 nodes of every offer)
      static:                       # nodes you can get, per region/config; cells left out get none
        aws:us-east-2/4xL4: 6
      traces:                       # or per pool a CSV "time_s,nodes": from time_s (seconds from the
        aws:us-east-2/1xL40S: pools/l40s.csv   # workloads' start) that many nodes, until the next row
    workloads:                      # one per model, mapped by name
      Phi-4-14B: {source: "csv:requests.csv#phi-4", scale: 1.0}
      Acme-8B: {source: "servegen:m-small", mean_rate: 5.0}
    kubernetes: {namespace: llm, image: vllm/vllm-openai:v0.11.0, model_sources: {Acme-8B: acme/8b}}

Workload scaling is explicit: ``scale: X`` multiplies the request rate, ``mean_rate: R`` scales
it to R requests/s on average, neither keeps it as recorded. Relative paths are relative to the
fleet file. Every error names the file, the entry and the field.

This module only parses and validates (the bottom layer imports nothing above it); loading the
workloads and putting the fleet to work is :mod:`atoll.envs.fleet_file`.
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any

import yaml

from atoll.solvers.catalog import load_catalog
from atoll.solvers.errors import InputError, UnknownNameError
from atoll.solvers.models import get_model
from atoll.solvers.runtime import DEPLOY_RUNTIME, RUNTIMES
from atoll.solvers.types import NODE_GPU_COUNTS, GpuType, ModelSpec, Offer, Slo

TOP_KEYS = ("name", "runtime", "models", "gpus", "regions", "availability", "workloads", "kubernetes",
            "n_max", "rho")
_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_CONFIG = re.compile(r"([1-9][0-9]*)x(.+)")


class FleetFileError(InputError):
    """A fleet file that cannot be used; the message names the file, the entry, the field."""


@dataclass(frozen=True)
class PoolTrace:
    """Nodes a pool offers over time: ``nodes[i]`` from ``times_s[i]`` (seconds from the start of
    the workloads) until the next time; the first time is 0, the last count holds to the end."""

    times_s: tuple[float, ...]
    nodes: tuple[int, ...]
    source: str

    def at(self, seconds: float) -> int:
        return self.nodes[max(0, bisect.bisect_right(self.times_s, seconds) - 1)]


def _pool_trace(path: Path, where: str, file: Path) -> PoolTrace:
    """Read a pool's CSV (header ``time_s,nodes``; times from 0, increasing; whole nodes >= 0)."""
    try:
        lines = file.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise _fail(path, where, f"trace file {file} cannot be read ({exc}); give a CSV with columns "
                                 f"time_s,nodes") from None
    if not lines or [c.strip() for c in lines[0].split(",")] != ["time_s", "nodes"]:
        raise _fail(path, where, f"{file}: line 1 must be the header 'time_s,nodes'")
    times: list[float] = []
    nodes: list[int] = []
    for n, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        cols = line.split(",")
        try:
            t, k = float(cols[0]), float(cols[1])
        except (ValueError, IndexError):
            raise _fail(path, where, f"{file}: line {n} {line!r} must be two numbers "
                                     f"'time_s,nodes'") from None
        if not (math.isfinite(t) and t >= 0) or (times and t <= times[-1]):
            raise _fail(path, where, f"{file}: line {n}: time_s {t:g} must be >= 0 and increasing")
        if not (math.isfinite(k) and k >= 0 and k.is_integer()):
            raise _fail(path, where, f"{file}: line {n}: nodes {cols[1].strip()!r} must be a whole "
                                     f"number >= 0")
        times.append(t)
        nodes.append(int(k))
    if not times or times[0] != 0:
        raise _fail(path, where, f"{file}: the first row must be at time_s 0")
    return PoolTrace(tuple(times), tuple(nodes), str(file))


@dataclass(frozen=True)
class WorkloadSpec:
    """One model's demand: a workload name (``servegen:...``, ``azure:...``, ``csv:PATH#NAME``)
    and its explicit scaling (``scale`` factor or ``mean_rate`` req/s; at most one)."""

    model: str
    source: str
    scale: float | None = None
    mean_rate: float | None = None


@dataclass(frozen=True)
class FleetSpec:
    """A parsed, validated fleet file. ``offers`` are every (region, config) the fleet may use
    with its prices; ``availability`` None means ample."""

    path: Path
    name: str
    runtime: str
    models: tuple[ModelSpec, ...]
    user_models: tuple[ModelSpec, ...]
    gpus: tuple[GpuType, ...]
    offers: tuple[Offer, ...]
    availability: Mapping[tuple[str, str], int] | None
    workloads: tuple[WorkloadSpec, ...]
    kubernetes: Mapping[str, Any]
    n_max: int = 6
    rho: float = 12.0
    pool_traces: tuple[tuple[tuple[str, str], PoolTrace], ...] = ()

    @property
    def model_names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.models)

    @property
    def regions(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(o.region for o in self.offers))

    @property
    def gpu_types(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(_CONFIG.fullmatch(o.config).group(2) for o in self.offers))  # type: ignore[union-attr]


def _fail(path: Path, where: str, msg: str) -> FleetFileError:
    return FleetFileError(f"{path}: {where}: {msg}")


def _number(path: Path, where: str, field_: str, value: Any, *, integer: bool = False,
            minimum: float = 0.0, strict: bool = False) -> float:
    ok = not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)
    if ok and integer:
        ok = float(value).is_integer()
    if not ok or value < minimum or (strict and value <= minimum):
        kind = "a whole number" if integer else "a number"
        bound = f"> {minimum:g}" if strict else f">= {minimum:g}"
        raise _fail(path, where, f"field '{field_}' must be {kind} {bound}, got {value!r}")
    return float(value)


def _mapping(path: Path, where: str, value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _fail(path, where, f"must be a mapping ({what}), got {type(value).__name__}")
    return value


def _build(cls: type, entry: dict[str, Any], path: Path, where: str) -> Any:
    kwargs = dict(entry)
    if cls is ModelSpec:
        slo = kwargs.pop("slo", None)
        if not isinstance(slo, dict) or set(slo) != {"ttft_ms", "tpot_ms"}:
            raise _fail(path, where, "field 'slo' must be a mapping with ttft_ms and tpot_ms (milliseconds)")
        kwargs["aliases"] = tuple(kwargs.get("aliases", ()))
    allowed = {f.name for f in fields(cls)}
    required = sorted(f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING
                      and f.name != "slo")
    missing = [n for n in required if n not in kwargs]
    if missing:
        raise _fail(path, where, f"missing field(s) {missing}")
    extra = sorted(set(kwargs) - allowed)
    if extra:
        raise _fail(path, where, f"unknown field(s) {extra}; valid: {sorted(allowed)}")
    try:
        if cls is ModelSpec:
            kwargs["slo"] = Slo(**slo)
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise _fail(path, where, str(exc)) from exc


def _models(path: Path, raw: Any) -> tuple[list[ModelSpec], list[ModelSpec]]:
    if not isinstance(raw, list) or not raw:
        raise _fail(path, "models", "must be a non-empty list of catalog names or model definitions")
    out: list[ModelSpec] = []
    user: list[ModelSpec] = []
    for i, entry in enumerate(raw):
        where = f"models[{i}]"
        if isinstance(entry, str):
            try:
                out.append(get_model(entry))
            except UnknownNameError as exc:
                raise _fail(path, where, f"{exc.args[0]}; or give a full definition with an slo") from None
        elif isinstance(entry, dict):
            where = f"models[{i}] ({entry.get('name', '?')!r})"
            model = _build(ModelSpec, entry, path, where)
            out.append(model)
            user.append(model)
        else:
            raise _fail(path, where, f"must be a model name or a mapping, got {entry!r}")
    names = [m.name for m in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise _fail(path, "models", f"lists {dup[0]!r} twice")
    return out, user


def _offers(path: Path, raw: Any, gpus: Mapping[str, GpuType]) -> list[Offer]:
    if not isinstance(raw, list) or not raw:
        raise _fail(path, "regions", "must be a non-empty list of regions (name + catalog: true or offers)")
    catalog = load_catalog()
    out: list[Offer] = []
    for i, entry in enumerate(raw):
        where = f"regions[{i}]"
        region = _mapping(path, where, entry, "name, catalog/gpu_types or offers")
        name = region.get("name")
        if not isinstance(name, str) or ":" not in name:
            raise _fail(path, where, f"field 'name' must look like 'cloud:region' (e.g. aws:us-east-2), "
                                     f"got {name!r}")
        where = f"regions[{i}] ({name!r})"
        extra = sorted(set(region) - {"name", "catalog", "gpu_types", "offers"})
        if extra:
            raise _fail(path, where, f"unknown field(s) {extra}; valid: catalog, gpu_types, name, offers")
        if region.get("catalog"):
            if name not in catalog.regions:
                raise _fail(path, where, f"field 'name': the catalog has no region {name!r}; valid: "
                                         f"{', '.join(catalog.regions)} (or give 'offers')")
            wanted = region.get("gpu_types")
            if wanted is not None and not (isinstance(wanted, list)
                                           and all(isinstance(g, str) for g in wanted)):
                raise _fail(path, where, f"field 'gpu_types' must be a list of GPU names, got {wanted!r}")
            for g in wanted or ():
                if g not in catalog.gpus:
                    raise _fail(path, where, f"field 'gpu_types': unknown GPU type {g!r}; valid: "
                                             f"{', '.join(catalog.gpus)}")
            sold = [o for c, o in sorted(catalog.offers_in(name).items())
                    if wanted is None or _CONFIG.fullmatch(c).group(2) in wanted]  # type: ignore[union-attr]
            if not sold:
                raise _fail(path, where, f"the catalog sells none of {wanted} in {name}")
            out.extend(sold)
        for j, o in enumerate(region.get("offers") or ()):
            w = f"{where} offers[{j}]"
            o = _mapping(path, w, o, "config, on_demand, spot")
            extra = sorted(set(o) - {"config", "on_demand", "spot"})
            if extra:
                raise _fail(path, w, f"unknown field(s) {extra}; valid: config, on_demand, spot")
            cfg = o.get("config")
            m = _CONFIG.fullmatch(cfg) if isinstance(cfg, str) else None
            if not m or int(m.group(1)) not in NODE_GPU_COUNTS:
                raise _fail(path, w, f"field 'config' must be '<count>x<GPU>' with count in "
                                     f"{NODE_GPU_COUNTS}, "
                                     f"got {cfg!r}")
            if m.group(2) not in gpus:
                raise _fail(path, w, f"field 'config': unknown GPU type {m.group(2)!r}; add it under 'gpus' "
                                     f"or use one of {', '.join(gpus)}")
            if "on_demand" not in o:
                raise _fail(path, w, "missing field 'on_demand' ($/node-hour)")
            od = _number(path, w, "on_demand", o["on_demand"], strict=True)
            spot = None if o.get("spot") is None else _number(path, w, "spot", o["spot"], strict=True)
            out.append(Offer(name, str(cfg), od, spot, "fleet-file"))
        if not region.get("catalog") and not region.get("offers"):
            raise _fail(path, where, "needs 'catalog: true' or a list of 'offers'")
    cells = [(o.region, o.config) for o in out]
    dup = sorted({c for c in cells if cells.count(c) > 1})
    if dup:
        raise _fail(path, "regions", f"offers {dup[0][0]}/{dup[0][1]} twice")
    return out


def _cell(path: Path, where: str, key: Any, cells: set[tuple[str, str]]) -> tuple[str, str]:
    region, sep, cfg = str(key).rpartition("/")
    if not sep or (region, cfg) not in cells:
        valid = ", ".join(f"{r}/{c}" for r, c in sorted(cells))
        raise _fail(path, where, f"{key!r} is not an offered region/config; valid: {valid}")
    return region, cfg


BUNDLED_DIR = Path(__file__).resolve().parent / "data" / "fleets"


def bundled_fleets() -> dict[str, Path]:
    """The fleet files shipped with the package (the bundled scenarios), by name."""
    return {p.stem: p for p in sorted(BUNDLED_DIR.glob("*.yaml"))}


def resolve_fleet(path_or_name: Path | str) -> Path:
    """A fleet file path, or the name of a bundled one (``core``, ``extended``)."""
    path = Path(path_or_name)
    if not path.exists() and str(path_or_name) in bundled_fleets():
        return bundled_fleets()[str(path_or_name)]
    return path


def load_fleet(path: Path | str) -> FleetSpec:
    """Parse and validate a fleet file (see the module docstring); a bare bundled name
    (``core``, ``extended``) loads the shipped file."""
    path = resolve_fleet(path)
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FleetFileError(f"{path}: file not found; pass the path of a fleet YAML file or a bundled "
                             f"fleet's name ({', '.join(bundled_fleets())})") from None
    except (OSError, yaml.YAMLError) as exc:
        raise FleetFileError(f"{path}: cannot be read as YAML ({exc})") from exc
    doc = _mapping(path, "top level", doc, f"keys {', '.join(TOP_KEYS)}")
    extra = sorted(set(doc) - set(TOP_KEYS))
    if extra:
        raise _fail(path, "top level", f"unknown key {extra[0]!r}; valid keys: {', '.join(TOP_KEYS)}")
    name = doc.get("name")
    if not isinstance(name, str) or len(name) > 40 or not _NAME.fullmatch(name):
        raise _fail(path, "name", f"must be lowercase letters, digits and '-' (<= 40), got {name!r}")
    runtime = doc.get("runtime", DEPLOY_RUNTIME)
    if runtime not in RUNTIMES:
        raise _fail(path, "runtime", f"must be one of {', '.join(RUNTIMES)}, got {runtime!r}")
    gpus = dict(load_catalog().gpus)
    user_gpus = []
    for i, entry in enumerate(doc.get("gpus") or ()):
        where = f"gpus[{i}]"
        g = _build(GpuType, _mapping(path, where, entry, "fields of a GPU type"), path,
                   f"{where} ({entry.get('name', '?')!r})")
        user_gpus.append(g)
        gpus[g.name] = g
    models, user_models = _models(path, doc.get("models"))
    offers = _offers(path, doc.get("regions"), gpus)
    cells = {(o.region, o.config) for o in offers}
    availability: dict[tuple[str, str], int] | None = None
    pool_traces: list[tuple[tuple[str, str], PoolTrace]] = []
    if doc.get("availability") is not None:
        av = _mapping(path, "availability", doc["availability"], "static and/or traces")
        extra = sorted(set(av) - {"static", "traces"})
        if extra:
            raise _fail(path, "availability", f"unknown key {extra[0]!r}; valid: static, traces")
        availability = {}
        static = _mapping(path, "availability.static", av.get("static") or {}, "region/config: nodes")
        for key, n in static.items():
            where = f"availability.static[{key!r}]"
            availability[_cell(path, where, key, cells)] = int(_number(path, where, "nodes", n, integer=True))
        traces = _mapping(path, "availability.traces", av.get("traces") or {}, "region/config: CSV file")
        for key, file in traces.items():
            where = f"availability.traces[{key!r}]"
            cell = _cell(path, where, key, cells)
            if cell in availability:
                raise _fail(path, where, "this pool also has a static count; give one or the other")
            pool_traces.append((cell, _pool_trace(path, where, path.parent / str(file))))
    workloads = []
    raw_w = _mapping(path, "workloads", doc.get("workloads"), "model name: {source, scale | mean_rate}")
    names = [m.name for m in models]
    for key, entry in raw_w.items():
        where = f"workloads[{key!r}]"
        try:
            model = get_model(str(key), user_models).name
        except UnknownNameError:
            model = str(key)
        if model not in names:
            raise _fail(path, where, f"names no model of this fleet; models: {', '.join(names)}")
        entry = _mapping(path, where, entry, "source and optional scale or mean_rate")
        extra = sorted(set(entry) - {"source", "scale", "mean_rate"})
        if extra:
            raise _fail(path, where, f"unknown field(s) {extra}; valid: mean_rate, scale, source")
        source = entry.get("source")
        if not isinstance(source, str) or ":" not in source:
            raise _fail(path, where, f"field 'source' must be a workload such as 'csv:requests.csv#model', "
                                     f"'servegen:m-large' or 'azure:code', got {source!r}")
        if source.startswith("csv:"):
            file, sep, sub = source[4:].partition("#")
            source = f"csv:{(path.parent / file).resolve()}{sep}{sub}"
        if "scale" in entry and "mean_rate" in entry:
            raise _fail(path, where, "give at most one of 'scale' and 'mean_rate'")
        scale = None if "scale" not in entry else _number(path, where, "scale", entry["scale"], strict=True)
        rate = None if "mean_rate" not in entry else _number(path, where, "mean_rate", entry["mean_rate"],
                                                             strict=True)
        workloads.append(WorkloadSpec(model, source, scale, rate))
    missing = [n for n in names if n not in {w.model for w in workloads}]
    if missing:
        raise _fail(path, "workloads", f"no workload for model {missing[0]!r}; give one per model")
    kube = _mapping(path, "kubernetes", doc.get("kubernetes") or {}, "K8sOptions fields")
    n_max = int(_number(path, "n_max", "n_max", doc.get("n_max", 6), integer=True, minimum=1))
    rho = _number(path, "rho", "rho", doc.get("rho", 12.0), strict=True)
    return FleetSpec(path, name, runtime, tuple(models), tuple(user_models), tuple(user_gpus), tuple(offers),
                     availability, tuple(workloads), dict(kube), n_max, rho, tuple(pool_traces))
