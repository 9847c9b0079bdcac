"""The controller's persisted state: what a restarted controller needs to resume where it stopped.

One JSON file, ``<dir>/controller-state.json``, replaced atomically on every save (temporary
file in the same directory, fsync, ``os.replace``), so a controller killed at any instant
leaves either the previous state or the new one, never a torn file. A file that does not
parse, or that a different schema version wrote, is refused with a message that names it and
says how to recover; it is never silently replaced, since that would forget the running plan.
A state file that cannot be written (a read-only folder, a full disk) is a :class:`StateError`
naming it: the tick stops there, before the sink sees a plan the state does not record, so
the next start resumes from the last state saved with nothing lost or delivered twice.

One controller per folder: :class:`StateLock` holds an exclusive ``fcntl`` lock on
``<dir>/controller.lock`` (recording the holder's PID and host) for the controller's lifetime.
A second controller on the folder gets :class:`StateLocked` naming the holder; the kernel
drops the lock when its holder dies however it dies, so a dead controller's lock is simply
taken over. (``flock`` is local to a host: a folder shared over NFS needs one host per folder.)
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import math
import os
import re
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from atoll.control.metrics import MetricsSnapshot
from atoll.control.plans import PlanRecord
from atoll.solvers.errors import AtollError
from atoll.solvers.files import atomic_write_text
from atoll.solvers.packing import Packing, PackingError
from atoll.solvers.validation import check_fraction, check_integer, check_number

STATE_VERSION = 1
STATE_FILE = "controller-state.json"
LOCK_FILE = "controller.lock"
SAVE_ATTEMPTS = 3  # a save out of file descriptors is tried again after a short wait
SAVE_RETRY_S = 0.5
HISTORY_LIMIT = 2016  # a week of 5-minute intervals: enough for a daily-seasonal forecaster's refit
_ID = re.compile(r"[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?")


class StateError(AtollError):
    """The state file exists but cannot be used; the message names it and the fix."""


class StateLocked(StateError):
    """Another live controller holds the state folder; the message names its PID and host."""


class StateLock:
    """An exclusive lock on a state folder for as long as this object is held (see the module
    docstring). ``took_over`` describes the dead holder whose lock this one replaced, if any."""

    def __init__(self, directory: Path | str) -> None:
        self.directory = Path(directory)
        self.path = self.directory / LOCK_FILE
        self.took_over: str | None = None
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            # O_NOFOLLOW: a planted controller.lock symlink would make the truncate below empty
            # whatever file it points at
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise StateError(f"cannot lock the state folder {self.directory}: {self.path} is a symbolic "
                                 f"link; remove it (the controller creates its own lock file)") from exc
            raise StateError(f"cannot lock the state folder {self.directory}: {exc.strerror or exc} "
                             f"({self.path}); make the folder writable or choose another --state") from exc
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = self._holder()
            os.close(self._fd)
            raise StateLocked(f"the state folder {self.directory} is in use by another controller "
                              f"({holder}); stop that one first, or give this one another --state") from exc
        previous = self._read()
        if previous.get("pid"):
            self.took_over = self._describe(previous)
        record = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
        try:
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, (json.dumps(record) + "\n").encode(), 0)
        except OSError as exc:
            self.release()
            raise StateError(f"cannot write the lock file {self.path}: {exc.strerror or exc}; make the "
                             f"folder writable or choose another --state") from exc

    def _read(self) -> dict[str, Any]:
        try:
            doc = json.loads(os.pread(self._fd, 4096, 0) or b"{}")
        except (OSError, ValueError):
            return {}
        return doc if isinstance(doc, dict) else {}

    @staticmethod
    def _describe(doc: Mapping[str, Any]) -> str:
        since = doc.get("since")
        when = (time.strftime(" since %Y-%m-%d %H:%M:%S UTC", time.gmtime(since))
                if isinstance(since, int | float) and math.isfinite(since) else "")
        return f"PID {doc.get('pid', '?')} on host {doc.get('host', '?')}{when}"

    def _holder(self) -> str:
        return self._describe(self._read())

    def release(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)  # a clean exit leaves no holder behind
            with contextlib.suppress(OSError):
                os.close(self._fd)  # closing drops the flock; the file stays for the next holder
            self._fd = -1

    def __enter__(self) -> StateLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _opt_float(owner: str, name: str, value: float | None) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{owner}: field '{name}' must be None or finite and >= 0, got {value!r}")


@dataclass(frozen=True)
class HistoryPoint:
    """One interval's observed demand of a model: end time (s), token rates per phase (tokens/s:
    what each phase is forecast and planned from), the request rate (requests/s; information
    only), and the tokens per request measured from vLLM's request-length histograms (None when
    the servers do not export them: the request shape is then the scenario's, a prior).

    Stored as a list ``[time, prompt, generation, requests, prompt/request, generation/request]``;
    state files written before the last two existed hold four and still load. (Their
    ``requests_per_s`` was the token rates over the scenario's shape, not a measurement; it is
    only ever shown, never planned from.)"""

    time_s: float
    prompt_tokens_per_s: float
    generation_tokens_per_s: float
    requests_per_s: float | None = None
    prompt_tokens_per_request: float | None = None
    generation_tokens_per_request: float | None = None

    def __post_init__(self) -> None:
        owner = "HistoryPoint"
        if not isinstance(self.time_s, int | float) or not math.isfinite(self.time_s):
            raise ValueError(f"{owner}: field 'time_s' must be a finite number, got {self.time_s!r}")
        for name in ("prompt_tokens_per_s", "generation_tokens_per_s", "requests_per_s",
                     "prompt_tokens_per_request", "generation_tokens_per_request"):
            value = getattr(self, name)
            if value is None and name.endswith("tokens_per_s"):
                raise ValueError(f"{owner}: field '{name}' must be a number, got None")
            _opt_float(owner, name, value)

    @property
    def shape(self) -> tuple[float, float] | None:
        """Measured (prompt, generation) tokens per request, None unless both were measured."""
        a, b = self.prompt_tokens_per_request, self.generation_tokens_per_request
        return (a, b) if a is not None and b is not None else None

    def as_list(self) -> list[float | None]:
        row = [self.time_s, self.prompt_tokens_per_s, self.generation_tokens_per_s, self.requests_per_s]
        if self.prompt_tokens_per_request is not None or self.generation_tokens_per_request is not None:
            row += [self.prompt_tokens_per_request, self.generation_tokens_per_request]
        return row


def _requested(owner: str, entries: Any) -> tuple[tuple[float, str, float], ...]:
    """``requested`` as (time, GPU type, nodes): finite times, nodes >= 0."""
    requested = tuple((float(t), str(g), float(n)) for t, g, n in entries)
    if any(not math.isfinite(t) or not math.isfinite(n) or n < 0 for t, _, n in requested):
        raise ValueError(f"{owner}: field 'requested' must hold (finite time, GPU type, nodes >= 0), "
                         f"got {entries!r:.120}")
    return requested


def _desired(owner: str, entries: Any) -> tuple[tuple[float, str, int], ...]:
    """``desired`` as (time, service, instances): finite times, instances >= 0."""
    desired = tuple((float(t), str(s), int(n)) for t, s, n in entries)
    if any(not math.isfinite(t) or n < 0 for t, _, n in desired):
        raise ValueError(f"{owner}: field 'desired' must hold (finite time, service, instances >= 0), "
                         f"got {entries!r:.120}")
    return desired


def _churn(owner: str, entries: Any) -> tuple[tuple[float, int, int], ...]:
    """``churn`` as (time, added, removed): finite times, counts >= 0."""
    churn = tuple((float(t), int(a), int(r)) for t, a, r in entries)
    if any(not math.isfinite(t) or a < 0 or r < 0 for t, a, r in churn):
        raise ValueError(f"{owner}: field 'churn' must hold (finite time, added >= 0, removed >= 0), "
                         f"got {entries!r:.120}")
    return churn


def _templates(owner: str, templates: Any) -> dict[str, dict[str, Any]]:
    """``templates`` as plain dicts by key, sorted (a saved state reads the same every time)."""
    if not isinstance(templates, Mapping) or not all(isinstance(v, Mapping) for v in templates.values()):
        raise ValueError(f"{owner}: field 'templates' must map template keys to their descriptions")
    return {str(k): dict(v) for k, v in sorted(templates.items())}


def _packing(owner: str, packing: Any) -> dict[str, Any]:
    """``packing`` as a plain dict, once its nodes read as a plan's packing."""
    nodes = packing.get("nodes") if isinstance(packing, Mapping) else None
    try:
        Packing.from_json(nodes)
    except PackingError as exc:
        raise ValueError(f"{owner}: field 'packing' must be a plan's packing "
                         f"(atoll.solvers.packing.describe_packing): {exc}") from exc
    return dict(packing)


def _check_identity(owner: str, controller_id: Any, version: Any) -> None:
    """The owner label its objects carry ('' or a label value) and the schema version."""
    if not isinstance(controller_id, str) or (controller_id and not _ID.fullmatch(controller_id)):
        raise ValueError(f"{owner}: field 'controller_id' must be '' or a label value (<= 40 of a-z 0-9 "
                         f"-), got {controller_id!r}")
    if version != STATE_VERSION:
        raise ValueError(f"{owner}: field 'version' must be {STATE_VERSION}, got {version!r}")


def _counts(owner: str, name: str, counts: Any) -> dict[str, int]:
    """A mapping of names to counts >= 0 (instances per template, the tick a model was last
    re-optimized), keys as text; each count's error names its key."""
    out = {str(k): v for k, v in dict(counts).items()}
    for key, n in out.items():
        check_integer(owner, f"{name}[{key!r}]", n, minimum=0)
    return out


def _history(owner: str, history: Any, limit: int) -> dict[str, tuple[HistoryPoint, ...]]:
    """Each model's last ``limit`` history points (HistoryPoint values only)."""
    out = {str(m): tuple(points)[-limit:] for m, points in dict(history).items()}
    for model, points in out.items():
        if not all(isinstance(p, HistoryPoint) for p in points):
            raise ValueError(f"{owner}: field 'history' of {model!r} must hold HistoryPoint values")
    return out


def _until(owner: str, name: str, what: str, entries: Any) -> tuple[tuple[str, int, float], ...]:
    """(template key, instances >= 0, finite time) entries: instances starting until they are
    ready, or draining (replaced) until they stop; ``what`` names the time in an error."""
    out = tuple((str(k), n, float(at)) for k, n, at in entries)
    for key, n, at in out:
        check_integer(owner, f"{name}[{key!r}]", n, minimum=0)
        if not math.isfinite(at):
            raise ValueError(f"{owner}: field '{name}' {what} of {key!r} must be finite, got {at!r}")
    return out


def _unserved(owner: str, unserved: Any) -> dict[str, tuple[float, ...]]:
    """Each model's unserved shares of the last steps, each in [0, 1]."""
    out = {str(m): tuple(float(v) for v in shares) for m, shares in dict(unserved).items()}
    for model, shares in out.items():
        for v in shares:
            check_fraction(owner, f"unserved[{model!r}]", v)
    return out


@dataclass(frozen=True)
class ControllerState:
    """tick: ticks completed; last_tick_s: when the last one ended (controller clock, s);
    running: the last *delivered* plan, template key -> instances; plan_sequence: the last
    plan number used; pending: a plan made but not yet delivered (see ``atoll.control.sinks.deliver``);
    last_reoptimized: model -> tick of its last re-optimization; last_metrics: the rate
    tracker's baseline, so the first tick after a restart has rates; history: model -> recent
    per-interval demand, oldest first, at most ``history_limit`` points; starting / draining:
    (template key, instances, when they become ready / stop being billed) of the delivered plan's
    instances still starting and of removed ones still draining; replacing: (template key,
    instances, until when they serve) of instances a make-before-break change replaces, kept in
    the delivered plan until ``final`` — the change's removal phase — is delivered once their
    replacements are ready; unserved: model -> its unserved
    shares of the last steps, newest first (the observation's window); packing: for a fleet with
    slices, the delivered plan's nodes and the slices on each (``PlanRecord.packing``), where the
    next plan keeps its running slices (:func:`atoll.solvers.packing.repack`); templates: the
    delivered plan's template descriptions (``PlanRecord.templates``), so instances on templates a
    changed fleet no longer has can still be delivered while they retire; churn: the delivered
    changes of the last day as (time, instances added, instances removed)
    (:mod:`atoll.control.churn`); desired: the instances the solver wanted per service
    ("model/phase") over the scale-down window, as (time, service, instances)
    (``ControllerSettings.scale_down_window_s``); requested: the nodes the deliveries of the last
    hour started, as (time, GPU type, nodes) (the refused share's denominator,
    :mod:`atoll.control.risk_signals`)."""

    version: int = STATE_VERSION
    tick: int = 0
    last_tick_s: float | None = None
    running: dict[str, int] = field(default_factory=dict)
    plan_sequence: int = 0
    pending: PlanRecord | None = None
    last_reoptimized: dict[str, int] = field(default_factory=dict)
    last_metrics: MetricsSnapshot | None = None
    history: dict[str, tuple[HistoryPoint, ...]] = field(default_factory=dict)
    history_limit: int = HISTORY_LIMIT
    starting: tuple[tuple[str, int, float], ...] = ()
    cost_scale_usd_h: float | None = None
    draining: tuple[tuple[str, int, float], ...] = ()
    unserved: dict[str, tuple[float, ...]] = field(default_factory=dict)
    replacing: tuple[tuple[str, int, float], ...] = ()
    final: PlanRecord | None = None
    # the clock the times above are on: trace seconds per second of the metrics' clock (a state
    # written at one --time-scale is refused at another: its times would be years off)
    time_scale: float | None = None
    # who owns what the sinks write: every object and file carries it, pruning touches only its own
    controller_id: str = ""
    # the online capacity correction (atoll.envs.correction.CapacityCorrection.as_dict)
    correction: dict[str, Any] = field(default_factory=dict)
    packing: dict[str, Any] | None = None
    templates: dict[str, dict[str, Any]] = field(default_factory=dict)
    churn: tuple[tuple[float, int, int], ...] = ()
    desired: tuple[tuple[float, str, int], ...] = ()
    requested: tuple[tuple[float, str, float], ...] = ()

    def __post_init__(self) -> None:
        owner = "ControllerState"
        object.__setattr__(self, "requested", _requested(owner, self.requested))
        object.__setattr__(self, "desired", _desired(owner, self.desired))
        object.__setattr__(self, "churn", _churn(owner, self.churn))
        object.__setattr__(self, "templates", _templates(owner, self.templates))
        if self.packing is not None:
            object.__setattr__(self, "packing", _packing(owner, self.packing))
        if self.time_scale is not None:
            check_number(owner, "time_scale", self.time_scale)
        _check_identity(owner, self.controller_id, self.version)
        for name in ("tick", "plan_sequence"):
            check_integer(owner, name, getattr(self, name), minimum=0)
        check_integer(owner, "history_limit", self.history_limit, minimum=1)
        if self.last_tick_s is not None and not math.isfinite(self.last_tick_s):
            raise ValueError(f"{owner}: field 'last_tick_s' must be finite or None, got {self.last_tick_s!r}")
        running = _counts(owner, "running", self.running)
        last = _counts(owner, "last_reoptimized", self.last_reoptimized)
        history = _history(owner, self.history, self.history_limit)
        starting = _until(owner, "starting", "ready time", self.starting)
        if self.cost_scale_usd_h is not None:
            check_number(owner, "cost_scale_usd_h", self.cost_scale_usd_h, allow_zero=True)
        # both checked as 'draining' (replacing instances drain once their replacements serve)
        draining = _until(owner, "draining", "end time", self.draining)
        object.__setattr__(self, "replacing", _until(owner, "draining", "end time", self.replacing))
        unserved = _unserved(owner, self.unserved)
        object.__setattr__(self, "draining", draining)
        object.__setattr__(self, "unserved", unserved)
        object.__setattr__(self, "starting", starting)
        object.__setattr__(self, "running", {k: n for k, n in sorted(running.items()) if n})
        object.__setattr__(self, "last_reoptimized", dict(sorted(last.items())))
        object.__setattr__(self, "history", dict(sorted(history.items())))

    def with_history(self, model: str, point: HistoryPoint) -> ControllerState:
        """A copy with ``point`` appended to ``model``'s history (the oldest dropped past the limit)."""
        history = dict(self.history)
        history[model] = (*history.get(model, ()), point)[-self.history_limit:]
        return replace(self, history=history)

    def as_dict(self) -> dict[str, Any]:
        return {
            "version": self.version, "tick": self.tick, "last_tick_s": self.last_tick_s,
            "running": dict(self.running), "plan_sequence": self.plan_sequence,
            "pending": self.pending.as_dict() if self.pending else None,
            "last_reoptimized": dict(self.last_reoptimized),
            "last_metrics": self.last_metrics.as_dict() if self.last_metrics else None,
            "history": {m: [p.as_list() for p in points] for m, points in self.history.items()},
            "history_limit": self.history_limit,
            "starting": [list(e) for e in self.starting], "cost_scale_usd_h": self.cost_scale_usd_h,
            "draining": [list(e) for e in self.draining],
            "replacing": [list(e) for e in self.replacing],
            "final": self.final.as_dict() if self.final else None,
            "unserved": {m: list(v) for m, v in self.unserved.items()},
            "time_scale": self.time_scale, "controller_id": self.controller_id,
            "correction": dict(self.correction),
            **({"packing": dict(self.packing)} if self.packing is not None else {}),
            "templates": dict(self.templates), "churn": [list(c) for c in self.churn],
            "desired": [list(d) for d in self.desired],
            "requested": [list(r) for r in self.requested],
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> ControllerState:
        pending, metrics = doc.get("pending"), doc.get("last_metrics")
        return cls(
            version=doc["version"], tick=doc["tick"], last_tick_s=doc.get("last_tick_s"),
            running=dict(doc.get("running", {})), plan_sequence=doc.get("plan_sequence", 0),
            pending=PlanRecord.from_dict(pending) if pending else None,
            last_reoptimized=dict(doc.get("last_reoptimized", {})),
            last_metrics=MetricsSnapshot.from_dict(metrics) if metrics else None,
            history={m: tuple(_point(p) for p in points) for m, points in doc.get("history", {}).items()},
            history_limit=doc.get("history_limit", HISTORY_LIMIT),
            starting=tuple((str(k), int(n), float(t)) for k, n, t in doc.get("starting", [])),
            cost_scale_usd_h=doc.get("cost_scale_usd_h"),
            draining=tuple((str(k), int(n), float(t)) for k, n, t in doc.get("draining", [])),
            replacing=tuple((str(k), int(n), float(t)) for k, n, t in doc.get("replacing", [])),
            final=PlanRecord.from_dict(doc["final"]) if doc.get("final") else None,
            unserved={str(m): tuple(v) for m, v in doc.get("unserved", {}).items()},
            time_scale=doc.get("time_scale"), controller_id=doc.get("controller_id", ""),
            correction=dict(doc.get("correction") or {}), packing=doc.get("packing"),
            templates=dict(doc.get("templates") or {}),
            churn=tuple((float(t), int(a), int(r)) for t, a, r in doc.get("churn", [])),
            desired=tuple((float(t), str(s), int(n)) for t, s, n in doc.get("desired", [])),
            requested=tuple((float(t), str(g), float(n)) for t, g, n in doc.get("requested", [])),
        )


def _point(row: Any) -> HistoryPoint:
    if not isinstance(row, list) or not 3 <= len(row) <= 6:
        raise ValueError(f"a history point must be a list [time, prompt tokens/s, generation tokens/s, "
                         f"requests/s?, prompt tokens/request?, generation tokens/request?], "
                         f"got {row!r:.120}")
    return HistoryPoint(*row)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:40]} is beyond a float's range")
    return value


def _no_constant(text: str) -> float:
    raise ValueError(f"{text} is not a JSON number")


def sweep_temporary(directory: Path | str, prefix: str = f".{STATE_FILE}.") -> list[Path]:
    """Remove the temporary files an atomic write killed mid-way left in ``directory`` (the
    caller holds the folder's lock, so no write of its own is in progress); the paths removed."""
    removed = []
    for tmp in Path(directory).glob(f"{prefix}*.tmp"):
        with contextlib.suppress(OSError):
            tmp.unlink()
            removed.append(tmp)
    return removed


def state_path(directory: Path | str) -> Path:
    return Path(directory) / STATE_FILE


def save_state(directory: Path | str, state: ControllerState) -> Path:
    """Write ``state`` atomically to ``directory/controller-state.json`` (directory created)."""
    path = state_path(directory)
    # strict JSON (allow_nan=False): a NaN would make the file unreadable to other tools
    text = json.dumps(state.as_dict(), allow_nan=False, separators=(",", ":")) + "\n"
    for attempt in range(SAVE_ATTEMPTS):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(path, text)
            return path
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE) and attempt + 1 < SAVE_ATTEMPTS:
                # descriptors held by clients (a metrics scraper) are freed by their time-outs:
                # the save does not share their fate
                time.sleep(SAVE_RETRY_S * (attempt + 1))
                continue
            if exc.errno in (errno.EMFILE, errno.ENFILE):
                raise StateError(f"cannot write controller state {path}: too many open files — the process "
                                 f"reached its file-descriptor limit (not a permissions or disk problem); "
                                 f"raise it (ulimit -n) or find what holds descriptors; the tick stopped "
                                 f"before delivering anything the state does not record, and the next start "
                                 f"resumes from the last state saved") from exc
            raise StateError(f"cannot write controller state {path}: {exc.strerror or exc}; the tick stopped "
                             f"before delivering anything the state does not record — make the folder "
                             f"writable (or free disk space) and start again: it resumes from the last "
                             f"state saved") from exc
    return path


def load_state(directory: Path | str) -> ControllerState | None:
    """The saved state, or None when there is none yet; StateError when the file is unusable."""
    path = state_path(directory)
    fix = ("restore it from a backup, or delete it to start fresh (the controller then re-plans from "
           "nothing and forgets the running plan)")
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except UnicodeDecodeError as exc:
        raise StateError(f"controller state {path} is not UTF-8 text (byte {exc.start}: "
                         f"{exc.object[exc.start:exc.start + 8]!r}); {fix}") from exc
    except OSError as exc:
        raise StateError(f"cannot read controller state {path}: {exc}; check its permissions") from exc
    try:
        # a number beyond a float (1e999) or NaN/Infinity is not strict JSON: refused here, by name,
        # rather than read as inf and failing later far from the file
        doc = json.loads(text, parse_float=_finite_float, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        raise StateError(f"controller state {path} is not valid JSON ({exc}); {fix}") from exc
    if not isinstance(doc, dict):
        raise StateError(f"controller state {path} holds a {type(doc).__name__}, not an object; {fix}")
    version = doc.get("version")
    if version != STATE_VERSION:
        raise StateError(f"controller state {path} has schema version {version!r}; this atoll reads version "
                         f"{STATE_VERSION}; run the atoll that wrote it, or {fix}")
    try:
        return ControllerState.from_dict(doc)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, ArithmeticError) as exc:
        raise StateError(f"controller state {path} is malformed ({type(exc).__name__}: {exc}); "
                         f"{fix}") from exc
