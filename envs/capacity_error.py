"""A world that differs from the performance model: one true capacity factor per template family.

The performance model's held-out error is 8-15% median per dataset and about 20% for a GPU left
out of the fit (``atoll perf calibrate``); every plan inherits it. ``FleetConfig(capacity_error=
...)`` makes the simulated world differ from the model the same way: each **family** of
templates — (model, phase, GPU types, parallelism), see :func:`family_of` — serves its model
throughput times a factor drawn at reset. The planner never sees these factors, only the
model's capacity times what it has learned (:mod:`atoll.envs.correction`).

Specs (:meth:`CapacityError.parse`):

==================  ==========================================================================
``0`` / ``"none"``  the exact world (every factor 1), bit for bit the default
``"calibration"``   log-normal factors whose spread is the calibration's held-out error per GPU
                    type: sigma = median APE / 0.6745 (the median of abs(log f) for
                    log f ~ N(0, sigma^2) is 0.6745 sigma). Types profiled in the public data
                    use their held-out error (worst dataset); types without profiles (A10G,
                    L40S, H200) use the median leave-one-GPU-out error, because for them the
                    model is as untested as for a GPU left out of the fit
``0.12`` /          log-normal factors with that sigma for every family
``"sigma:0.12"``
``"stress:0.25"``   every family 1 - 0.25 or 1 + 0.25, each with probability 1/2
``"scale:0.75"``    every family exactly 0.75 (a fleet uniformly slower than its profiles)
``"file:PATH"``     fixed factors from a JSON object {family glob: factor}; the first matching
                    glob (in file order) wins, unmatched families are exact
==================  ==========================================================================

Drawn factors are clipped to [``FACTOR_MIN``, ``FACTOR_MAX``]: a template 2.5x off its profile
(or half of it) would be a broken deployment, not a modelling error. Draws are in sorted family order from the
generator the env passes (seeded), so the same seed gives the same world.
"""

from __future__ import annotations

import fnmatch
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from atoll.solvers.errors import InputError
from atoll.solvers.paths import perf_factors_path
from atoll.solvers.problem import TemplateIndex, gpu_type_of
from atoll.solvers.types import Template, gpus_of

KINDS: tuple[str, ...] = ("exact", "calibration", "sigma", "stress", "scale", "file")
FACTOR_MIN, FACTOR_MAX = 0.5, 2.0
_MAD_TO_SIGMA = 0.6745  # median of |Z| for Z ~ N(0, 1)


def family_of(template: Template) -> str:
    """``model/phase/GPU types/pp<stages>-tp<GPUs per node>``: templates whose true throughput
    errs together (same kernels on the same cards with the same parallel layout)."""
    types, tps = _layout(tuple(c for c, _ in template.nodes))
    return f"{template.service.name}/{types}/pp{len(template.stages)}-tp{tps}"


def families_of(templates: Sequence[Template], index: TemplateIndex) -> list[str]:
    """:func:`family_of` of every template of ``index`` (over ``templates``), in order: named once
    per distinct (service, GPU types, GPUs per node, stages) from the index's node entries, not
    once per template (fleet20: 278,511 templates, 0.4 s per env a pass). A family reads the
    template's node configs; a sliced library's entries are the nodes its slices are bought as,
    so it is named template by template."""
    rcs = index.rcs
    types = sorted({gpu_type_of(c) for _, c in rcs})
    tps = sorted({gpus_of(c) for _, c in rcs})
    stages = np.fromiter((len(t.stages) for t in templates), dtype=np.int64, count=len(templates))
    top = int(stages.max(initial=0)) + 1
    # one integer per (service, GPU types, GPUs per node, stages): it must fit in 63 bits
    if index.sliced_rcs or not len(templates) or \
            len(index.services) * 2 ** len(types) * 2 ** len(tps) * top >= 2 ** 63:
        return [family_of(t) for t in templates]
    type_bit = np.asarray([1 << types.index(gpu_type_of(c)) for _, c in rcs], dtype=np.int64)
    tp_bit = np.asarray([1 << tps.index(gpus_of(c)) for _, c in rcs], dtype=np.int64)
    starts = index.ptr[:-1]
    key = index.service * 2 ** len(types) + np.bitwise_or.reduceat(type_bit[index.rc], starts)
    key = key * 2 ** len(tps) + np.bitwise_or.reduceat(tp_bit[index.rc], starts)
    _, first, inverse = np.unique(key * top + stages, return_index=True, return_inverse=True)
    names = [family_of(templates[i]) for i in first.tolist()]
    return [names[j] for j in inverse.tolist()]


@lru_cache(maxsize=16384)
def _layout(configs: tuple[str, ...]) -> tuple[str, str]:
    """(GPU types, GPUs per node) of :func:`family_of` from a template's node configs: a library
    repeats a few thousand such multisets over every service and region (fleet20: 278,511
    templates), and the env names every template's family at reset."""
    types = "+".join(sorted({gpu_type_of(c) for c in configs}))
    tps = "/".join(str(n) for n in sorted({gpus_of(c) for c in configs}))
    return types, tps


def gpu_types_of_family(family: str) -> tuple[str, ...]:
    return tuple(family.split("/")[-2].split("+"))


def calibration_sigmas(path: Path | None = None) -> tuple[dict[str, float], float]:
    """(GPU type -> log-normal sigma, sigma for types the public profiles do not cover), from the
    calibration report the performance model reads (the user's when one exists)."""
    p = Path(path) if path is not None else perf_factors_path()
    try:
        mtime = p.stat().st_mtime_ns
    except OSError:
        mtime = 0
    return _calibration_sigmas(p, mtime)


@lru_cache(maxsize=2)
def _calibration_sigmas(path: Path, mtime_ns: int) -> tuple[dict[str, float], float]:
    try:
        report = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise InputError(f"capacity_error='calibration' needs the calibration report {path}: {exc}; "
                         f"run `atoll perf calibrate` or give a sigma") from exc
    by_type: dict[str, float] = {}
    for per_gpu in report.get("heldout_mape_by_gpu", {}).values():
        for gpu, mape in per_gpu.items():
            if isinstance(mape, int | float) and math.isfinite(mape):
                by_type[gpu] = max(by_type.get(gpu, 0.0), float(mape))
    logo = [float(v) for v in report.get("leave_one_gpu_out_mape", {}).values()
            if isinstance(v, int | float) and math.isfinite(v)]
    if not by_type or not logo:
        raise InputError(f"calibration report {path} has no held-out errors "
                         f"(heldout_mape_by_gpu, leave_one_gpu_out_mape); run `atoll perf calibrate`")
    return ({g: v / _MAD_TO_SIGMA for g, v in by_type.items()},
            float(np.median(logo)) / _MAD_TO_SIGMA)


def _calibration_sigma(gpu: str) -> float:
    by_type, fallback = calibration_sigmas()
    if gpu in by_type:
        return by_type[gpu]
    # the catalog names A100-40GB / A100-80GB where the profiles say A100-40GB or A100
    same = [v for g, v in by_type.items() if g.split("-")[0] == gpu.split("-")[0]]
    return max(same) if same else fallback


@dataclass(frozen=True)
class CapacityError:
    """How the true world differs from the performance model (see the module docstring)."""

    kind: str = "exact"
    value: float = 0.0
    path: str = ""
    factors: tuple[tuple[str, float], ...] = ()  # the file's (glob, factor) pairs, in order

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise InputError(f"CapacityError: field 'kind' must be one of {', '.join(KINDS)}, "
                             f"got {self.kind!r}")
        v = self.value
        if not (isinstance(v, int | float) and math.isfinite(v)):
            raise InputError(f"CapacityError: field 'value' must be a finite number, got {v!r}")
        if self.kind == "sigma" and not 0 < v <= 1:
            raise InputError(f"CapacityError: sigma must be in (0, 1], got {v!r}")
        if self.kind == "stress" and not 0 < v < 1:
            raise InputError(f"CapacityError: stress must be in (0, 1) (factors 1 - s and 1 + s), got {v!r}")
        if self.kind == "scale" and not FACTOR_MIN <= v <= FACTOR_MAX:
            raise InputError(f"CapacityError: scale must be in [{FACTOR_MIN}, {FACTOR_MAX}], got {v!r}")

    @property
    def exact(self) -> bool:
        return self.kind == "exact"

    @property
    def label(self) -> str:
        if self.kind in ("exact", "calibration"):
            return "0" if self.kind == "exact" else "calibration"
        if self.kind == "file":
            return f"file:{self.path}"
        return f"{self.kind}:{self.value:g}"

    @classmethod
    def parse(cls, spec: float | str | CapacityError) -> CapacityError:
        """A spec as FleetConfig and the CLI take it (see the module docstring)."""
        if isinstance(spec, CapacityError):
            return spec
        hint = ("give 0, calibration, a sigma such as 0.12, sigma:S, stress:S, scale:F or file:PATH")
        if isinstance(spec, bool):
            raise InputError(f"capacity_error {spec!r} is not a spec; {hint}")
        if isinstance(spec, int | float):
            if spec == 0:
                return cls()
            return cls("sigma", float(spec))
        if not isinstance(spec, str):
            raise InputError(f"capacity_error {spec!r} is not a spec; {hint}")
        text = spec.strip()
        if text in ("0", "0.0", "none", "exact", ""):
            return cls()
        if text == "calibration":
            return cls("calibration")
        kind, sep, rest = text.partition(":")
        if not sep:
            kind, rest = "sigma", text
        if kind == "file":
            return cls.from_file(rest)
        if kind not in ("sigma", "stress", "scale"):
            raise InputError(f"capacity_error {spec!r}: unknown kind {kind!r}; {hint}")
        try:
            value = float(rest)
        except ValueError:
            raise InputError(f"capacity_error {spec!r}: {rest!r} is not a number; {hint}") from None
        return cls(kind, value)

    @classmethod
    def from_file(cls, path: str) -> CapacityError:
        p = Path(path).expanduser()
        try:
            doc = json.loads(p.read_text())
        except FileNotFoundError:
            raise InputError(f"capacity_error file {str(p)!r} does not exist; give a JSON object "
                             f"{{\"family glob\": factor}}") from None
        except (OSError, ValueError) as exc:
            raise InputError(f"capacity_error file {str(p)!r} is not readable JSON: {exc}") from exc
        if not isinstance(doc, dict) or not doc:
            raise InputError(f"capacity_error file {str(p)!r} must hold a non-empty JSON object "
                             f"{{\"family glob\": factor}}, e.g. {{\"Phi-4-14B/decode/*\": 0.8}}")
        pairs = []
        for glob, factor in doc.items():
            ok = isinstance(factor, int | float) and not isinstance(factor, bool) and math.isfinite(factor)
            if not ok or not FACTOR_MIN <= factor <= FACTOR_MAX:
                raise InputError(f"capacity_error file {str(p)!r}: factor of {glob!r} must be a number in "
                                 f"[{FACTOR_MIN}, {FACTOR_MAX}], got {factor!r}")
            pairs.append((str(glob), float(factor)))
        return cls("file", 0.0, str(p), tuple(pairs))

    def draw(self, families: Iterable[str], rng: np.random.Generator | None) -> dict[str, float]:
        """The true factor of every family (sorted order; ``rng`` is only used by random kinds)."""
        names = sorted(set(families))
        if self.kind == "exact":
            return {f: 1.0 for f in names}
        if self.kind == "scale":
            return {f: float(self.value) for f in names}
        if self.kind == "file":
            out = {}
            for f in names:
                out[f] = next((v for glob, v in self.factors if fnmatch.fnmatchcase(f, glob)), 1.0)
            return out
        if rng is None:
            raise InputError(f"capacity_error {self.label!r} draws factors: pass a seeded generator")
        if self.kind == "stress":
            signs = rng.choice([-1.0, 1.0], size=len(names))
            return {f: 1.0 + s * self.value for f, s in zip(names, signs, strict=True)}
        z = rng.standard_normal(len(names))
        out = {}
        for f, zi in zip(names, z, strict=True):
            if self.kind == "sigma":
                sigma = self.value
            else:  # a pipeline across types errs like its worst-understood card
                sigma = max(_calibration_sigma(g) for g in gpu_types_of_family(f))
            out[f] = float(np.clip(math.exp(sigma * zi), FACTOR_MIN, FACTOR_MAX))
        return out
