"""The serving-template library (offline stage).

For each service (model x phase, budget = the model's TTFT or TPOT SLO) and region: enumerate
the multisets of node configs the region sells (restricted to the chosen GPU types) with at most
``n_max`` nodes, total GPU memory below ``rho`` x the model's weights, and enough memory to hold
the model (total memory >= weights and the nodes' :func:`max_layers_that_fit` sum to >= layers);
place each exactly (:mod:`atoll.solvers.placement`, every node used); drop dominated templates.

Dominance: B dominates A (same service and region) if B has no more nodes of any config and at
least A's throughput. A is dominated iff the best throughput over its proper sub-multisets is >=
A's; that maximum is computed exactly by recursion over immediate sub-multisets (memoized), with
no assumption that adding a node never lowers throughput (it can under ``runtime="vllm"``, where
a node is always a new stage and every stage's budget shrinks). Of an exact tie the smaller
multiset is kept.

Runtime (:mod:`atoll.solvers.runtime`): ``any`` places each multiset in any pipeline shape;
``vllm`` keeps only multisets of one GPU count with a tensor-parallel size the model accepts, and
places them one node per stage. The runtime is part of every cache key.

A job is one (service, region); jobs run in local worker processes (default) or on a Ray cluster
and are cached on disk one file per job (:mod:`atoll.solvers.template_store`).
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from atoll.solvers.catalog import DEFAULT_GPU_TYPES, DEFAULT_REGIONS, Catalog, load_catalog
from atoll.solvers.models import DEFAULT_MODELS, get_model
from atoll.solvers.perf import PerfFactors, RequestShape, load_factors, max_layers_that_fit
from atoll.solvers.placement import best_placement, profile_table, solve, to_stages
from atoll.solvers.problem import adopt_index, template_index
from atoll.solvers.ray_tasks import completed
from atoll.solvers.registry import UnknownNameError
from atoll.solvers.runtime import (
    DEFAULT_RUNTIME,
    RUNTIMES,
    leader_first,
    multiset_ok,
    runtime_tag,
    vllm_last_configs,
    vllm_multisets,
    with_slices,
)
from atoll.solvers.template_store import (
    CODE_VERSION,
    LibraryStore,
    TemplateStore,
    check_templates,
    default_cache_dir,
    digest,
    paused_gc,
    template_from_json,
    template_to_json,
)
from atoll.solvers.types import (
    DEFAULT_PD,
    PD_MODES,
    ModelSpec,
    NodeConfig,
    Phase,
    Service,
    Stage,
    Template,
    pd_phases,
)

if TYPE_CHECKING:
    from atoll.solvers.scenarios import ScenarioSpec

__all__ = ["SCENARIO_LIBRARIES", "LibrarySpec", "TemplateJob", "TemplateLibrary", "best_placement",
           "build_library", "default_cache_dir", "enumerate_multisets", "remove_dominated", "run_job"]

MAX_N_MAX = 8  # set partitions of 8 nodes are already 4140; beyond, the exact search explodes
DEFAULT_SHAPE = RequestShape()
COLOCATED_VERSION = 2  # bump when the co-located capacity model changes (it enters those jobs' keys)
SLICES_VERSION = 1  # bump when what a slice build produces changes (it enters slice jobs' keys)


def _names(owner: str, fname: str, values: Iterable[str], resolve: Callable[[str], str]) -> tuple[str, ...]:
    if isinstance(values, str):
        raise TypeError(f"{owner}: field '{fname}' must be a sequence of names, not a string")
    out: list[str] = []
    for v in values:
        try:
            name = resolve(v)
        except UnknownNameError as exc:
            raise ValueError(f"{owner}: field '{fname}': {exc}") from exc
        if name in out:
            raise ValueError(f"{owner}: field '{fname}' lists {name!r} twice")
        out.append(name)
    if not out:
        raise ValueError(f"{owner}: field '{fname}' must name at least one entry")
    return tuple(out)


def _region(catalog: Catalog, name: str) -> str:
    if name not in catalog.regions:
        raise UnknownNameError(f"unknown region {name!r}; valid regions: {', '.join(catalog.regions)}")
    return name


def _shape_value(field_: str, model: str, value: Any) -> None:
    if not isinstance(value, RequestShape):
        raise TypeError(f"LibrarySpec: field '{field_}' needs RequestShape values, got {value!r}")


def _pd_value(field_: str, model: str, value: Any) -> None:
    if value not in PD_MODES:
        raise ValueError(f"LibrarySpec: field '{field_}' of {model!r} must be one of {', '.join(PD_MODES)}, "
                         f"got {value!r}")


@dataclass(frozen=True)
class LibrarySpec:
    """What a template library covers. Names are canonicalized (model aliases, GPU name case).

    ``model_shapes`` optionally overrides ``shape`` per model, as (model name, shape) pairs.
    ``runtime``: ``any`` (every pipeline shape) or ``vllm`` (what stock vLLM runs), see
    :mod:`atoll.solvers.runtime`. ``slices`` (``vllm`` only): stages may also use g of a node's
    G GPUs; the ILP then buys whole nodes and packs the slices. ``fleet``: a fleet file's scenario,
    whose own models, GPU types and offers the names resolve in (None: the shipped catalog).
    ``pd``: how models are served (:data:`~atoll.solvers.types.PD_MODES`): ``disaggregated``
    builds prefill and decode templates, ``aggregated`` co-located ones (one replica serves both),
    ``auto`` all three, and the ILP chooses per model; ``model_pd`` overrides it per model, as
    (model name, mode) pairs.
    """

    models: tuple[str, ...]
    regions: tuple[str, ...]
    gpu_types: tuple[str, ...]
    n_max: int = 6
    rho: float = 12.0
    shape: RequestShape = DEFAULT_SHAPE
    model_shapes: tuple[tuple[str, RequestShape], ...] = field(default=())
    runtime: str = DEFAULT_RUNTIME
    slices: bool = False
    fleet: ScenarioSpec | None = None
    pd: str = DEFAULT_PD
    model_pd: tuple[tuple[str, str], ...] = field(default=())

    def __post_init__(self) -> None:
        owner = "LibrarySpec"
        if self.pd not in PD_MODES:
            raise ValueError(f"{owner}: field 'pd' must be one of {', '.join(PD_MODES)}, got {self.pd!r}")
        if self.runtime not in RUNTIMES:
            raise ValueError(f"{owner}: field 'runtime' must be one of {', '.join(RUNTIMES)}, "
                             f"got {self.runtime!r}")
        if not isinstance(self.slices, bool):
            raise TypeError(f"{owner}: field 'slices' must be a bool, got {self.slices!r}")
        if self.slices and self.runtime != "vllm":
            # 'any' keeps Coral's whole-node semantics (the paper's decomposition)
            raise ValueError(f"{owner}: field 'slices' needs runtime 'vllm', got {self.runtime!r}")
        catalog = self.catalog
        models = _names(owner, "models", self.models, lambda n: self.model(n).name)
        object.__setattr__(self, "models", models)
        object.__setattr__(self, "regions", _names(owner, "regions", self.regions,
                                                   lambda n: _region(catalog, n)))
        object.__setattr__(self, "gpu_types", _names(owner, "gpu_types", self.gpu_types,
                                                     lambda n: catalog.gpus[n].name))
        n_max = self.n_max
        if isinstance(n_max, bool) or not isinstance(n_max, int) or not 1 <= n_max <= MAX_N_MAX:
            raise ValueError(f"{owner}: field 'n_max' must be an integer in 1..{MAX_N_MAX}, got {n_max!r}")
        if isinstance(self.rho, bool) or not isinstance(self.rho, int | float) or not (
                math.isfinite(self.rho) and self.rho > 0):
            raise ValueError(f"{owner}: field 'rho' must be a finite number > 0, got {self.rho!r}")
        if not isinstance(self.shape, RequestShape):
            raise TypeError(f"{owner}: field 'shape' must be a RequestShape, got {self.shape!r}")
        shapes = self._per_model("model_shapes", self.model_shapes, models, _shape_value)
        object.__setattr__(self, "model_shapes", shapes)
        # a mode equal to the library's own is no override: left out, so equal specs compare equal
        modes = self._per_model("model_pd", self.model_pd, models, _pd_value)
        object.__setattr__(self, "model_pd", tuple((m, v) for m, v in modes if v != self.pd))

    def _per_model(self, field_: str, pairs: Iterable[tuple[str, Any]], models: tuple[str, ...],
                   check: Callable[[str, str, Any], None]) -> tuple[tuple[str, Any], ...]:
        """(model name, value) pairs with canonical names, in ``models`` order; a name that is not
        a model of the library, or a value ``check`` refuses, is a ValueError naming the field."""
        owner = "LibrarySpec"
        out = []
        for name, value in dict(pairs).items():
            try:
                canon = self.model(name).name
            except UnknownNameError as exc:
                raise ValueError(f"{owner}: field '{field_}': {exc}") from exc
            if canon not in models:
                raise ValueError(f"{owner}: field '{field_}' names {canon!r}, which is not in 'models'")
            check(field_, canon, value)
            out.append((canon, value))
        return tuple(sorted(out, key=lambda p: models.index(p[0])))

    def shape_of(self, model: str) -> RequestShape:
        return dict(self.model_shapes).get(model, self.shape)

    def pd_of(self, model: str) -> str:
        """How ``model`` is served (its ``model_pd`` entry, else ``pd``)."""
        return dict(self.model_pd).get(model, self.pd)

    @property
    def catalog(self) -> Catalog:
        return load_catalog() if self.fleet is None else self.fleet.catalog

    def model(self, name: str) -> ModelSpec:
        return get_model(name) if self.fleet is None else self.fleet.model(name)

    def to_json(self) -> dict[str, Any]:
        return {"models": list(self.models), "regions": list(self.regions), "gpu_types": list(self.gpu_types),
                "n_max": self.n_max, "rho": self.rho, "shape": asdict(self.shape),
                "model_shapes": {m: asdict(s) for m, s in self.model_shapes}, "runtime": self.runtime,
                **({"slices": True} if self.slices else {}),
                # written only when it differs from the default, so disaggregated libraries keep their keys
                **({"pd": self.pd} if self.pd != "disaggregated" else {}),
                **({"model_pd": dict(self.model_pd)} if self.model_pd else {})}

    @staticmethod
    def from_json(data: dict[str, Any]) -> LibrarySpec:
        try:
            return LibrarySpec(
                models=tuple(data["models"]), regions=tuple(data["regions"]),
                gpu_types=tuple(data["gpu_types"]), n_max=int(data["n_max"]), rho=float(data["rho"]),
                shape=RequestShape(**data["shape"]),
                model_shapes=tuple((m, RequestShape(**s)) for m, s in data.get("model_shapes", {}).items()),
                runtime=str(data.get("runtime", DEFAULT_RUNTIME)), slices=bool(data.get("slices", False)),
                pd=str(data.get("pd", "disaggregated")),
                model_pd=tuple((str(m), str(v)) for m, v in data.get("model_pd", {}).items()))
        except KeyError as exc:
            raise ValueError(f"LibrarySpec JSON: missing field {exc}") from exc

    def jobs(self, catalog: Catalog | None = None, factors: PerfFactors | None = None) -> list[TemplateJob]:
        """One job per (model, phase, region) with the configs the region sells of the GPU types;
        the phases are the model's serving mode's (:func:`~atoll.solvers.types.pd_phases`)."""
        catalog = catalog or self.catalog
        factors = factors or load_factors()
        out = []
        for m in self.models:
            model = self.model(m)
            for phase in pd_phases(self.pd_of(m)):
                for region in self.regions:
                    nodes = [catalog.config(name) for name in catalog.offers_in(region)
                             if catalog.config(name).gpu.name in self.gpu_types]
                    configs = tuple(sorted(with_slices(nodes) if self.slices else nodes,
                                           key=lambda c: c.name))
                    out.append(TemplateJob(model, phase, region, configs, self.n_max, self.rho,
                                           self.shape_of(m), factors, self.runtime))
        return out


# Library specs of the evaluation scenarios at the default request shape (benchmarks/templates.py);
# the scenarios themselves plan with atoll.solvers.scenarios.library_spec (per-model request shapes),
# and tests/solvers/test_scenarios_yaml.py holds these to the scenario files.
SCENARIO_LIBRARIES: dict[str, LibrarySpec] = {
    "core": LibrarySpec(models=("Phi-4-14B", "GPT-OSS-20B", "Qwen3-32B"), gpu_types=("L4", "A10G", "L40S"),
                        regions=("aws:us-east-2", "aws:ap-northeast-2")),
    "extended": LibrarySpec(models=DEFAULT_MODELS, gpu_types=DEFAULT_GPU_TYPES, regions=DEFAULT_REGIONS),
}


@dataclass(frozen=True)
class TemplateJob:
    """The templates of one service in one region (the unit of work and of caching)."""

    model: ModelSpec
    phase: Phase
    region: str
    configs: tuple[NodeConfig, ...]
    n_max: int
    rho: float
    shape: RequestShape
    factors: PerfFactors
    runtime: str = DEFAULT_RUNTIME

    @property
    def service(self) -> Service:
        return Service(self.model.name, self.phase)

    @property
    def budget_ms(self) -> float:
        return self.model.slo.budget_ms(self.phase)

    @property
    def min_chunk_tokens(self) -> float:
        """A co-located replica's smallest prefill chunk per step: a prompt of L tokens takes
        ceil(L / chunk) steps of at most TPOT each, so TTFT <= budget needs chunk >= L x TPOT / TTFT
        (0 for the other phases)."""
        if self.phase is not Phase.COLOCATED:
            return 0.0
        slo = self.model.slo
        return self.shape.input_tokens * slo.tpot_ms / slo.ttft_ms

    @property
    def key(self) -> str:
        """This job's identity: what it computes and for which model (the library key hashes these)."""
        return digest(self._key_fields(asdict(self.model)))

    @property
    def entry_key(self) -> str:
        """The key of what this job computes, the cache entry's: :attr:`key` without the model's
        name, role and aliases, so jobs of one architecture, SLO and request shape (a fine-tune and
        its base) share one entry and one run; a loaded entry is relabelled with the job's model."""
        model = {k: v for k, v in asdict(self.model).items() if k not in ("name", "role", "aliases")}
        return digest(self._key_fields(model))

    def _key_fields(self, model: dict[str, Any]) -> dict[str, Any]:
        return {
            "code_version": CODE_VERSION, "model": model, "phase": self.phase.value,
            "region": self.region,
            # Prices do not change templates, so they stay out of the key.
            "configs": [{"name": c.name, "gpu": asdict(c.gpu)} for c in self.configs],
            "n_max": self.n_max, "rho": self.rho, "shape": asdict(self.shape),
            "factors": self.factors.to_json(), "runtime": runtime_tag(self.runtime),
            # whole-node libraries keep their keys (and caches); slice configs are in "configs" too
            **({"slices": SLICES_VERSION} if any(c.node_gpus for c in self.configs) else {}),
            **({"colocated": COLOCATED_VERSION} if self.phase is Phase.COLOCATED else {}),
        }


def enumerate_multisets(model: ModelSpec, configs: Sequence[NodeConfig], n_max: int, rho: float,
                        shape: RequestShape, runtime: str = DEFAULT_RUNTIME) -> list[tuple[int, ...]]:
    """Sorted index tuples of the multisets worth placing: <= n_max nodes, memory < rho x
    weights, able to hold the model (memory >= weights, max layers that fit sum >= layers), and
    of a shape ``runtime`` can run.

    The ``rho`` cut only trims the search: it never removes the last multisets that can hold the
    model. When every one that can is above rho x weights (a small model on large nodes: a 0.5B
    model where only 8xMI300X are sold), the minimal ones — none of whose nodes can be dropped
    with the rest still holding the model — are kept."""
    weights = model.weight_bytes
    memory = [c.memory_gb * 1e9 for c in configs]  # a slice's own GPUs: rho judges the slice
    fit = [max_layers_that_fit(model, c, shape) for c in configs]
    out: list[tuple[int, ...]] = []
    over: list[tuple[int, ...]] = []
    if runtime == "any":
        candidates: Iterable[tuple[int, ...]] = (
            ms for n in range(1, n_max + 1)
            for ms in itertools.combinations_with_replacement(range(len(configs)), n))
    else:  # the same multisets, in the same order, without visiting the ones vllm cannot run
        candidates = vllm_multisets(configs, n_max)
    for ms in candidates:
        mem = sum(memory[i] for i in ms)
        if weights <= mem and sum(fit[i] for i in ms) >= model.layers and (
                runtime == "any" or multiset_ok(runtime, model, [configs[i] for i in ms])):
            (out if mem < rho * weights else over).append(ms)
    if out or not over:
        return out
    held = set(over)
    return [ms for ms in over if not any(ms[:i] + ms[i + 1:] in held for i in range(len(ms)))]


def remove_dominated(values: dict[tuple[int, ...], float]) -> list[tuple[int, ...]]:
    """Multisets (sorted index tuples) with throughput > 0 that no proper sub-multiset matches or
    beats. A multiset missing from ``values`` is not a template and counts as 0 (its own
    sub-multisets still count)."""
    best: dict[tuple[int, ...], float] = {}  # best throughput of ms or any sub-multiset of it

    def best_sub(ms: tuple[int, ...]) -> float:
        out = 0.0
        for sub in {ms[:i] + ms[i + 1:] for i in range(len(ms))}:
            if sub:
                got = best.get(sub)
                if got is None:
                    got = best[sub] = max(values.get(sub, 0.0), best_sub(sub))
                out = max(out, got)
        return out

    keep = [ms for ms, thr in values.items() if thr > 0.0 and best_sub(ms) < thr]
    return sorted(keep, key=lambda ms: (len(ms), ms))


@dataclass(frozen=True)
class JobResult:
    """The templates of one job, how many multisets were placed, and the job's seconds."""

    templates: tuple[Template, ...]
    evaluated: int
    seconds: float

    def to_json(self) -> dict[str, Any]:
        # Compact rows: a job's templates share service and region, and libraries run to 1e5 rows.
        services = sorted({(t.service.model, t.service.phase.value, t.region) for t in self.templates})
        # a co-located template's row adds its decode tokens/s
        rows = [[[list(n) for n in t.nodes], [[s.layers, list(s.nodes)] for s in t.stages], t.throughput,
                 *([t.decode_throughput] if t.colocated else [])]
                for t in self.templates]
        return {"evaluated": self.evaluated, "seconds": self.seconds, "services": services, "rows": rows}

    def relabelled(self, model: str) -> JobResult:
        """The same templates for ``model`` (a job that shares this one's entry, see
        :attr:`TemplateJob.entry_key`); the stages are shared, not copied."""
        if not self.templates or self.templates[0].service.model == model:
            return self
        service = Service(model, self.templates[0].service.phase)
        return JobResult(tuple(Template.trusted(service, t.region, t.nodes, t.stages, t.throughput,
                                                t.decode_throughput) for t in self.templates),
                         self.evaluated, self.seconds)

    @staticmethod
    def from_json(data: dict[str, Any], model: str | None = None) -> JobResult:
        """A job result from :meth:`to_json`; ``model`` names the templates' model (default the
        one the entry was computed for)."""
        rows, services = data["rows"], data["services"]
        if rows and len(services) != 1:
            raise ValueError("job result JSON: field 'services' must hold one (model, phase, region)")
        templates: tuple[Template, ...] = ()
        if rows:
            computed_for, phase, region = services[0]
            service = Service(str(model or computed_for), Phase(phase))
            region = str(region)
            # Rows come from a checksummed cache entry written by to_json from validated
            # templates, so skip re-validation (it was most of a 1e5-template load); the tuple
            # conversions stay, since JSON gives lists.
            # Stages repeat across a job's templates: build each distinct one once.
            stage_of: dict[tuple[int, tuple[str, ...]], Stage] = {}

            def stage(j: int, ns: list[str]) -> Stage:
                k = (j, tuple(ns))
                got = stage_of.get(k)
                if got is None:
                    got = stage_of[k] = Stage.trusted(*k)
                return got

            templates = tuple(
                Template.trusted(service, region, tuple((c, k) for c, k in row[0]),
                                 tuple(stage(j, ns) for j, ns in row[1]), float(row[2]),
                                 float(row[3]) if len(row) > 3 else 0.0)
                for row in rows)
        return JobResult(templates, int(data["evaluated"]), float(data["seconds"]))


def run_job(job: TemplateJob) -> JobResult:
    """Enumerate, place exactly and prune one (service, region). Runs in a worker process."""
    t0 = time.perf_counter()
    multisets = enumerate_multisets(job.model, job.configs, job.n_max, job.rho, job.shape, job.runtime)
    if not multisets:
        return JobResult((), 0, time.perf_counter() - t0)
    table = profile_table(job.model, job.configs, job.phase, job.budget_ms,
                          max_stages=max(len(ms) for ms in multisets), shape=job.shape, factors=job.factors,
                          min_chunk_tokens=job.min_chunk_tokens)
    # a co-located template serves decode tokens in the shape's ratio to its prompt tokens
    colocated = job.phase is Phase.COLOCATED
    decode_per_prompt = job.shape.output_tokens / job.shape.input_tokens if colocated else 0.0
    chain = job.runtime == "vllm"
    index = {c.name: i for i, c in enumerate(job.configs)}

    def last_of(ms: tuple[int, ...]) -> frozenset[int] | None:
        allowed = vllm_last_configs([job.configs[i].name for i in ms]) if chain else None
        return None if allowed is None else frozenset(index[n] for n in allowed)

    placed = {ms: solve(table, ms, one_node_per_stage=chain, last_configs=last_of(ms)) for ms in multisets}
    templates = []
    for ms in remove_dominated({ms: p.throughput for ms, p in placed.items()}):
        nodes = tuple((job.configs[i].name, ms.count(i)) for i in sorted(set(ms)))
        t = Template(job.service, job.region, nodes, to_stages(placed[ms], job.configs),
                     placed[ms].throughput, placed[ms].throughput * decode_per_prompt)
        templates.append(leader_first(t) if chain else t)
    return JobResult(tuple(templates), len(multisets), time.perf_counter() - t0)


@dataclass(frozen=True)
class TemplateLibrary:
    """The templates of a :class:`LibrarySpec`, in job order (model, phase, region), each job's by
    node count then configs. ``build_seconds`` is the wall time of the call that produced it (a
    load when ``from_cache``); ``key`` hashes the keys of all its jobs."""

    spec: LibrarySpec
    templates: tuple[Template, ...]
    build_seconds: float
    from_cache: bool
    key: str

    def for_service(self, service: Service) -> list[Template]:
        return [t for t in self.templates if t.service == service]

    def for_model(self, model_name: str) -> list[Template]:
        name = self.spec.model(model_name).name
        return [t for t in self.templates if t.service.model == name]

    def counts(self) -> dict[str, int]:
        """Templates per service name (all regions), every service of the spec listed."""
        out = {Service(m, p).name: 0 for m in self.spec.models for p in pd_phases(self.spec.pd_of(m))}
        for t in self.templates:
            out[t.service.name] += 1
        return out

    def to_json(self) -> dict[str, Any]:
        return {"format": "atoll-template-library", "code_version": CODE_VERSION, "key": self.key,
                "spec": self.spec.to_json(), "build_seconds": self.build_seconds,
                "from_cache": self.from_cache, "templates": [template_to_json(t) for t in self.templates]}

    @staticmethod
    def from_json(data: dict[str, Any]) -> TemplateLibrary:
        if not isinstance(data, dict) or data.get("format") != "atoll-template-library":
            raise ValueError("TemplateLibrary JSON: field 'format' must be 'atoll-template-library'")
        try:
            return TemplateLibrary(LibrarySpec.from_json(data["spec"]),
                                   tuple(template_from_json(t) for t in data["templates"]),
                                   float(data["build_seconds"]), bool(data["from_cache"]), str(data["key"]))
        except KeyError as exc:
            raise ValueError(f"TemplateLibrary JSON: missing field {exc}") from exc


def _start_local(todo: list[TemplateJob], workers: int) -> Iterator[tuple[TemplateJob, JobResult]]:
    """Submit every job now and yield results as they finish.

    Submitting before the caller starts its progress-bar thread matters: with the default fork
    start method the pool forks all its workers at the first submit, and forking a process that
    runs other threads is unsafe. (fork also spares scripts the ``if __name__ == "__main__"``
    guard that spawn needs.)
    """
    if workers <= 1 or len(todo) <= 1:
        return ((job, run_job(job)) for job in todo)
    from concurrent.futures import ProcessPoolExecutor, as_completed

    pool = ProcessPoolExecutor(max_workers=min(workers, len(todo)))
    futures = {pool.submit(run_job, job): job for job in todo}

    def results() -> Iterator[tuple[TemplateJob, JobResult]]:
        try:
            for fut in as_completed(futures):
                yield futures[fut], fut.result()
        finally:  # on an error or an abandoned build, do not run the queued jobs to the end
            pool.shutdown(wait=True, cancel_futures=True)

    return results()


def _start_ray(todo: list[TemplateJob], address: str) -> Iterator[tuple[TemplateJob, JobResult]]:
    """The same jobs as Ray tasks. The cluster's workers need atoll installed (``atoll[ray]``)."""
    try:
        import ray
    except ImportError as exc:
        raise RuntimeError("ray_address needs Ray, an optional extra: pip install 'atoll[ray]'") from exc
    started = not ray.is_initialized()
    if started:
        ray.init(address=address, log_to_driver=False)
    remote = ray.remote(run_job)
    pending = {remote.remote(job): job for job in todo}

    def results() -> Iterator[tuple[TemplateJob, JobResult]]:
        try:
            yield from completed(pending)
        finally:
            if started:
                ray.shutdown()

    return results()


def _load_jobs(store: TemplateStore, keys: list[str], by_key: dict[str, TemplateJob],
               results: dict[str, JobResult]) -> None:
    """Read every trustworthy cached job of ``keys`` into ``results``: each entry is read and
    checked once, then relabelled for every job that shares it (:attr:`TemplateJob.entry_key`)."""
    sharing: dict[str, list[str]] = {}
    for key in keys:
        sharing.setdefault(by_key[key].entry_key, []).append(key)
    for entry, sharers in sharing.items():
        payload = store.load(entry)
        if payload is None:
            continue
        job = by_key[sharers[0]]  # what the checks read is in the entry key: the same for every sharer
        try:
            result = JobResult.from_json(payload, job.model.name)
            check_templates(result.templates, [c.name for c in job.configs], job.model.layers)
            if result.evaluated == 0 and enumerate_multisets(
                    job.model, job.configs, job.n_max, job.rho, job.shape, job.runtime):
                # an empty entry of a build whose rho cut removed every multiset (before the
                # cut kept the last ones): rebuild it; entries with templates are unchanged
                continue
        except (KeyError, TypeError, ValueError) as exc:  # checksummed, yet not a job result
            logging.getLogger(__name__).warning("template cache entry %s: %s; rebuilding it",
                                                store.path(entry), exc)
            continue
        for key in sharers:
            results[key] = result.relabelled(by_key[key].model.name)


def build_library(spec: LibrarySpec, *, cache_dir: Path | None = None, workers: int | None = None,
                  ray_address: str | None = None, progress: bool | Callable[[int, int], None] = True,
                  use_cache: bool = True, catalog: Catalog | None = None) -> TemplateLibrary:
    """Build (or load from the on-disk cache) the template library of ``spec``.

    cache_dir: default :func:`default_cache_dir`; use_cache=False neither reads nor writes it.
    workers: local worker processes (default ``os.cpu_count()``; 1 runs in this process).
    ray_address: run the jobs on this Ray cluster instead ("auto", "ray://host:10001", ...).
    progress: a rich progress bar on stderr; or a callable ``(multisets done now, total)`` the
    caller reports with (the CLI's progress lines when stderr is not a terminal).
    catalog: the offers per region (default the shipped catalog; the job keys hold the configs,
    so another catalog's templates are cached apart).
    """
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ValueError(f"workers must be an integer >= 1, got {workers!r}")
    t0 = time.perf_counter()
    jobs = spec.jobs(catalog)
    keys = [job.key for job in jobs]
    by_key = dict(zip(keys, jobs, strict=True))
    directory = cache_dir if cache_dir is not None else default_cache_dir()
    store = TemplateStore(directory) if use_cache else None
    library_key = digest({"code_version": CODE_VERSION, "jobs": keys})
    whole = LibraryStore(directory) if use_cache else None
    if whole is not None:
        loaded = whole.load(library_key)
        if loaded is not None:
            templates, state = loaded
            # the problems over this library find its index made; a file stored before indexes
            # were is rewritten with its index once
            if state is None or adopt_index(templates, state) is None:
                whole.save(library_key, templates, template_index(templates).state())
            return TemplateLibrary(spec, templates, time.perf_counter() - t0, True, library_key)
    results: dict[str, JobResult] = {}
    if store is not None:
        with paused_gc():
            _load_jobs(store, keys, by_key, results)
    # Jobs of one entry key (a fine-tune and its base) run once; the others take its templates.
    sharing: dict[str, list[TemplateJob]] = {}
    for job, key in zip(jobs, keys, strict=True):
        if key not in results:
            sharing.setdefault(job.entry_key, []).append(job)
    todo = [group[0] for group in sharing.values()]
    # Largest first keeps the workers busy to the end.
    weight = {job.key: len(enumerate_multisets(job.model, job.configs, job.n_max, job.rho, job.shape,
                                               job.runtime))
              for job in todo}
    todo.sort(key=lambda j: -weight[j.key])
    if todo:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        running = (_start_ray(todo, ray_address) if ray_address is not None
                   else _start_local(todo, workers or os.cpu_count() or 1))
        with Progress(TextColumn("templates"), BarColumn(), MofNCompleteColumn(), TextColumn("multisets"),
                      TimeElapsedColumn(), console=Console(stderr=True),
                      disable=not progress or callable(progress)) as bar:
            total = sum(weight.values())
            task = bar.add_task("build", total=total)
            for job, result in running:
                for sharer in sharing[job.entry_key]:
                    results[sharer.key] = result.relabelled(sharer.model.name)
                if store is not None:
                    store.save(job.entry_key, result.to_json())
                bar.advance(task, weight[job.key])
                if callable(progress):
                    progress(weight[job.key], total)
    templates = tuple(t for key in keys for t in results[key].templates)
    if whole is not None:
        whole.save(library_key, templates, template_index(templates).state())
    return TemplateLibrary(spec, templates, time.perf_counter() - t0, not todo, library_key)
