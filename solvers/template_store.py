"""On-disk cache of template-library jobs, and the JSON form of templates.

One file per job (one service in one region), named by the job's key: a SHA-256 of everything
the job's templates depend on (model spec, the region's configs and their GPU specs, perf
factors, N_max, rho, request shape, :data:`CODE_VERSION`). Per-job entries let libraries that
group the same jobs differently (one build of three models, or three builds of one) share them.

A file is trusted only if its header parses and names the key it is stored under, and its
payload bytes match the header's SHA-256 checksum and parse; otherwise it is reported (logged)
and rebuilt, never used. Writes go to a temporary
file first and are renamed into place, so a crash never leaves a half-written entry.

Beside the per-job entries, a whole library is kept once more as one binary file
(:class:`LibraryStore`, ``<library key>.lib``): the templates as Python objects with their keys
already computed, and their index's arrays (:class:`atoll.solvers.problem.TemplateIndex`), so a
warm load is one read instead of a JSON parse and object build per template (3-4 s for the 92,133
templates of ``extended``, ~0.5 s this way) and a problem over the library needs no pass over it.
It is a pickle under the same header and checksum: it is read only from the user's own cache
folder, and one that fails its header, checksum or layout check is rebuilt from the per-job
entries.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import hashlib
import json
import logging
import math
import pickle
from collections.abc import Collection, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from atoll.solvers.errors import InputError
from atoll.solvers.files import atomic_write_bytes
from atoll.solvers.paths import cache_root
from atoll.solvers.types import Phase, Service, Stage, Template

# Bump when the enumeration, placement or dominance rules change what a build produces.
CODE_VERSION = 1
FORMAT = "atoll-template-job"
LIBRARY_FORMAT = "atoll-template-library"

log = logging.getLogger(__name__)


def default_cache_dir() -> Path:
    """``templates/`` under :func:`atoll.solvers.paths.cache_root`."""
    return cache_root() / "templates"


def canonical(data: Any) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), allow_nan=False)


def digest(data: Any) -> str:
    return hashlib.sha256(canonical(data).encode()).hexdigest()


def template_to_json(t: Template) -> dict[str, Any]:
    return {
        "service": {"model": t.service.model, "phase": t.service.phase.value},
        "region": t.region,
        "nodes": [[c, k] for c, k in t.nodes],
        "stages": [{"layers": s.layers, "nodes": list(s.nodes)} for s in t.stages],
        "throughput": t.throughput,
        **({"decode_throughput": t.decode_throughput} if t.colocated else {}),
    }


def template_from_json(data: Mapping[str, Any]) -> Template:
    """Inverse of :func:`template_to_json`; malformed input raises ValueError naming the field."""
    try:
        service = Service(str(data["service"]["model"]), Phase(data["service"]["phase"]))
        nodes = tuple((str(c), int(k)) for c, k in data["nodes"])
        stages = tuple(Stage(int(s["layers"]), tuple(str(n) for n in s["nodes"])) for s in data["stages"])
        return Template(service, str(data["region"]), nodes, stages, float(data["throughput"]),
                        float(data.get("decode_throughput", 0.0)))
    except KeyError as exc:
        raise ValueError(f"template JSON: missing field {exc}") from exc
    except (TypeError, AttributeError) as exc:
        raise ValueError(f"template JSON: malformed field ({exc})") from exc


class CacheCorrupt(InputError):
    """A cache file that exists but cannot be trusted."""


def check_templates(templates: Iterable[Template], configs: Collection[str], layers: int) -> None:
    """Validate a cache entry's templates against the job they claim to be (a checksum proves
    only that the bytes are the ones written, not that the writer was atoll): throughput finite
    and > 0, node configs among the job's, whole node counts >= 1, stages using the template's
    nodes and covering the model's ``layers``. Raises :class:`CacheCorrupt` naming the first
    bad template."""
    known = set(configs)
    for i, t in enumerate(templates):
        where = f"template {i} ({t.service.name}, {t.region})"
        for thr in (t.throughput, t.decode_throughput)[:len(t.covers)]:
            number = isinstance(thr, int | float) and not isinstance(thr, bool)
            if not number or not (math.isfinite(thr) and thr > 0):
                raise CacheCorrupt(f"{where}: throughput {thr!r} must be finite and > 0")
        names = set()
        for config, count in t.nodes:
            if config not in known:
                raise CacheCorrupt(f"{where}: node config {config!r} is not one of the job's "
                                   f"({', '.join(sorted(known))})")
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                raise CacheCorrupt(f"{where}: count of {config!r} must be an integer >= 1, got {count!r}")
            names.add(config)
        total = 0
        for stage in t.stages:
            if isinstance(stage.layers, bool) or not isinstance(stage.layers, int) or stage.layers < 1:
                raise CacheCorrupt(f"{where}: a stage holds {stage.layers!r} layers; must be >= 1")
            if not set(stage.nodes) <= names:
                raise CacheCorrupt(f"{where}: a stage uses nodes {sorted(set(stage.nodes) - names)} the "
                                   f"template does not hold")
            total += stage.layers
        if total != layers:
            raise CacheCorrupt(f"{where}: its stages hold {total} layers, the model has {layers}")


class TemplateStore:
    """Job results by key under one directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)

    def path(self, key: str) -> Path:
        return self.directory / f"{key}.json"

    def load(self, key: str) -> dict[str, Any] | None:
        """The payload stored under ``key``; None if absent or untrustworthy (logged)."""
        path = self.path(key)
        if not path.exists():
            return None
        try:
            return self._read(path, key)
        except CacheCorrupt as exc:
            log.warning("template cache %s: %s; rebuilding it", path, exc)
            return None

    @staticmethod
    def _read(path: Path, key: str) -> dict[str, Any]:
        # Line 1: a small JSON header; the rest: the payload, whose bytes the header's checksum
        # covers (hashing the stored bytes is much faster than re-encoding parsed JSON).
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise CacheCorrupt(f"unreadable ({exc})") from exc
        head, sep, body = raw.partition(b"\n")
        try:
            header = json.loads(head)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CacheCorrupt(f"unreadable header ({exc})") from exc
        if not sep or not isinstance(header, dict) or header.get("format") != FORMAT:
            raise CacheCorrupt(f"not an {FORMAT} file")
        if header.get("key") != key:
            raise CacheCorrupt(f"stale: holds key {header.get('key')!r}, expected {key!r}")
        if header.get("checksum") != hashlib.sha256(body).hexdigest():
            raise CacheCorrupt("checksum mismatch")
        try:
            payload = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CacheCorrupt(f"unreadable payload ({exc})") from exc
        if not isinstance(payload, dict):
            raise CacheCorrupt("payload is not a JSON object")
        return payload

    def save(self, key: str, payload: dict[str, Any]) -> Path:
        body = canonical(payload).encode()
        header = {"format": FORMAT, "code_version": CODE_VERSION, "key": key,
                  "checksum": hashlib.sha256(body).hexdigest()}
        return _write_entry(self.path(key), header, body)


def _write_entry(path: Path, header: dict[str, Any], body: bytes) -> Path:
    """A header line, then ``body``: written to a temporary file and renamed into place, so a
    crash never leaves a half-written entry."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, canonical(header).encode() + b"\n" + body)
    return path


@contextlib.contextmanager
def paused_gc(*, young_first: bool = False) -> Iterator[None]:
    """The cyclic garbage collector off while a library's 1e5 objects are made, and those objects
    frozen after (:func:`gc.freeze`). Why: each allocation burst triggers passes over every
    object built so far (two thirds of a JSON load's time), and afterwards every full
    collection of the run would walk the 1e6 objects of a library again (50 ms each, 1.5 s of a
    fleet20 day's first step). Libraries and their indexes live as long as the process and
    hold no cycles; frozen objects are still freed by reference counting.

    ``young_first``: collect the young generations first, for objects built again and again
    during a run (a capacity correction's rescaled index, 2e5-entry tuples and maps on fleet20,
    which would otherwise be walked by the next young collections each time): a freeze keeps
    whatever else is alive at that moment out of every later collection, so the cyclic garbage
    of the last steps is collected before, while the young generations are small, instead of
    kept for good. The objects frozen are still freed by reference counting when dropped."""
    was = gc.isenabled()
    if young_first:
        gc.collect(1)
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was:
            gc.enable()


def _layout() -> str:
    """The field names of the classes a library pickle holds: a pickle of another layout is
    rebuilt, never read into objects whose fields moved."""
    classes = (Template, Stage, Service)
    return digest({cls.__name__: [f.name for f in dataclasses.fields(cls)] for cls in classes})


class LibraryStore:
    """Whole libraries by library key (binary, see the module docstring) under one directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)

    def path(self, key: str) -> Path:
        return self.directory / f"{key}.lib"

    def load(self, key: str) -> tuple[tuple[Template, ...], dict[str, Any] | None] | None:
        """(the templates stored under ``key``, the index state stored with them or None); None if
        absent or untrustworthy (logged). A file written before index states were stored holds
        the templates alone."""
        path = self.path(key)
        if not path.exists():
            return None
        try:
            raw = path.read_bytes()
            head, sep, body = raw.partition(b"\n")
            header = json.loads(head)
            if not sep or not isinstance(header, dict) or header.get("format") != LIBRARY_FORMAT:
                raise CacheCorrupt(f"not an {LIBRARY_FORMAT} file")
            if header.get("key") != key or header.get("layout") != _layout():
                raise CacheCorrupt("stale: another library or class layout")
            if header.get("checksum") != hashlib.sha256(body).hexdigest():
                raise CacheCorrupt("checksum mismatch")
            with paused_gc():
                stored = pickle.loads(body)
        except (OSError, ValueError, CacheCorrupt, pickle.UnpicklingError, EOFError, AttributeError) as exc:
            log.warning("template library cache %s: %s; rebuilding it from the job entries", path, exc)
            return None
        templates, state = (stored.get("templates"), stored.get("index")) if isinstance(stored, dict) \
            else (stored, None)
        if not isinstance(templates, tuple) or not all(isinstance(t, Template) for t in templates):
            log.warning("template library cache %s: not a tuple of templates; rebuilding it", path)
            return None
        return templates, state if isinstance(state, dict) else None

    def save(self, key: str, templates: tuple[Template, ...], index: dict[str, Any] | None = None) -> Path:
        """Store ``templates`` under ``key``, with ``index``: their index state
        (:meth:`atoll.solvers.problem.TemplateIndex.state`), so a load need not scan them."""
        for t in templates:  # stored with what every consumer computes first
            _ = t.key, t.node_use, t.has_slices, t.service.name
        body = pickle.dumps({"templates": templates, "index": index}, protocol=pickle.HIGHEST_PROTOCOL)
        header = {"format": LIBRARY_FORMAT, "code_version": CODE_VERSION, "key": key, "layout": _layout(),
                  "checksum": hashlib.sha256(body).hexdigest()}
        return _write_entry(self.path(key), header, body)
