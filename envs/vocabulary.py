"""atoll's typed vocabulary: the one place a policy, a planning level or a re-optimization is
parsed from text and printed back to it.

Policies and levels reach atoll as text — a command's ``--policy fixed:3@0.95``, a contest grid,
a per-model assignment in a results file, a controller decision ``grow@0.95``. Each is parsed
here, once, at that edge, into a frozen value; everything past the edge takes the value (or calls
these parsers), and ``str(value)`` prints the canonical text back (``parse_policy(str(p)) == p``).
A policy is always a value past the edge: only the command line (``atoll.control.cli``), file
readers and benchmark scripts call :func:`parse_policy`; a library function takes a
:class:`PolicySpec`, and results keyed by a policy are keyed by its ``str(spec)``.

The grammar (``q`` a planning level of :data:`PLANNING_LEVELS`; without ``@q`` a rule plans at
the environment's configured level, :data:`DEFAULT_LEVEL` unless set):

==============================  ==================================================================
``fixed:K[@q]``                 every model every K >= 1 steps
``threshold[:LOW:HIGH][@q]``    a model whose forecast / planned capacity leaves [LOW, HIGH]
``grow:K[@q]``                  a grow every step, a full re-plan every K-th
``never``                       one plan for the day's peak
``hindsight``                   the realized demand (a reference, not a policy)
``oracle-rate``                 the trace's own rate (a reference)
``oracle-quantile[@q]``         the q quantile of the demand sampled from that rate (a reference)
``per-model:K1@q1[+R1],...``    model i fully every K_i steps at q_i (taking risk R_i), one entry per model
``learned:<model uri>``         a logged policy (an MLflow URI or ``name@alias`` / ``name/N``)
``learned:file:PATH``           a policy file (a folder with its card, model and statistics)
==============================  ==================================================================

Any rule may end in ``+RISK``, the risk its re-plans take for every model
(:class:`~atoll.solvers.problem.Risk`: ``h<headroom>``, ``s<spread>``, ``f<on-demand floor>``,
joined by commas, e.g. ``fixed:1@0.9+h0.7`` or ``threshold@0.95+h0.85,s0.5``); without it a rule
takes the environment's configured risk (``FleetConfig.risk``, neutral unless set). A neutral
suffix (``+neutral``) is the same as none and prints as none.

A per-model entry may end in its own ``+RISK`` (``per-model:1@0.9+h0.85,f0.3,6@0.95``): an entry
starts with its K, so a comma-separated part that is a risk's part (``h``, ``s`` or ``f`` and a
number) continues the risk of the entry before it. When any entry names a risk, the entries
without one take the neutral risk; when none does, every entry takes the environment's configured
risk, as a rule does.

A re-optimization (:class:`Reoptimization`) is ``hold``, ``full@q`` or ``grow@q``, optionally
with the risk it takes (``full@0.9+h0.7``). A pool
(:data:`Pool`) is a (region, node config) pair, the unit availability and prices are given for.

The levels are the forecast's own quantiles, so their values live in
:mod:`atoll.forecast.forecasters` (the layer below) and are named here; the same holds for
:data:`Pool`, which the solvers' layer needs (:mod:`atoll.solvers.types`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, TypeAlias

from atoll.forecast.forecasters import DEFAULT_LEVEL, PLANNING_LEVELS
from atoll.solvers.errors import InputError, UnknownNameError
from atoll.solvers.problem import Risk
from atoll.solvers.types import Pool

__all__ = ["DEFAULT_LEVEL", "KINDS", "PER_MODEL_PREFIX", "PER_MODEL_USAGE", "PLANNING_LEVELS", "POLICY_USAGE",
           "RISK_SEPARATOR", "Entry", "RULE_KINDS", "Level", "PolicySpec", "Pool", "Reoptimization", "Risk",
           "check_level", "format_level", "parse_level", "parse_policy", "parse_risk"]

Level: TypeAlias = float  # a planning level: the forecast quantile a re-plan provisions for
# A per-model entry: (K steps, level) or (K steps, level, the non-neutral risk it takes).
Entry: TypeAlias = tuple[int, Level] | tuple[int, Level, Risk]

# Re-optimization kinds, in the order of the Fleet-v1 action's codes.
KINDS: tuple[str, ...] = ("hold", "full", "grow")
# Rule kinds make_policy builds, and the kinds that take no argument and no level.
RULE_KINDS: tuple[str, ...] = ("fixed", "threshold", "grow", "never", "hindsight", "oracle-rate",
                               "oracle-quantile")
_BARE: tuple[str, ...] = ("never", "hindsight", "oracle-rate")
_NO_ARGUMENT: tuple[str, ...] = (*_BARE, "oracle-quantile")  # a level, but no argument
PER_MODEL_PREFIX = "per-model:"
LEARNED_PREFIX = "learned:"

POLICY_USAGE = ("fixed:K[@q] (K >= 1 steps), threshold[:LOW:HIGH][@q], grow:K[@q], never, hindsight, "
                "oracle-rate, oracle-quantile[@q]; q a planning level in "
                + ", ".join(f"{q:g}" for q in PLANNING_LEVELS))
PER_MODEL_USAGE = ("per-model:K1@q1[+RISK1],K2@q2[+RISK2],... (one K@q per model, in the fleet's order, each "
                   "optionally with its risk, e.g. per-model:1@0.9+h0.85,f0.3,6@0.95)")
RISK_SEPARATOR = "+"  # a rule's risk suffix: fixed:1@0.9+h0.7
RISK_USAGE = ("+RISK after a rule, RISK = h<headroom in (0, 1]>, s<spread in (0, 1]>, f<on-demand floor in "
              "[0, 1]> joined by commas (e.g. fixed:1@0.9+h0.7 or threshold+h0.85,s0.5)")


def parse_risk(text: str, spec: str = "") -> Risk:
    """The :class:`~atoll.solvers.problem.Risk` a suffix names (``h0.7``, ``h0.85,s0.5``,
    ``neutral``); ``spec`` names the text it came from. An InputError naming both and the grammar."""
    where = f"bad policy {spec!r}: " if spec else ""
    if not text.strip():
        raise InputError(f"{where}the risk after {RISK_SEPARATOR!r} is empty; use {RISK_USAGE}")
    try:
        return Risk.parse(text)
    except ValueError as exc:
        raise InputError(f"{where}{exc}; use {RISK_USAGE}") from None


def format_level(q: float) -> str:
    """A level as the grammar writes it (``0.9``, ``0.95``)."""
    return f"{q:g}"


def check_level(q: float, what: str = "planning level") -> Level:
    """``q`` when it is one of :data:`PLANNING_LEVELS`, else an InputError listing them."""
    if q not in PLANNING_LEVELS:
        raise InputError(f"{what} {q!r} is not forecast; use one of "
                         f"{', '.join(format_level(v) for v in PLANNING_LEVELS)}")
    return float(q)


def parse_level(text: str, spec: str = "") -> Level:
    """A planning level from its text (``"0.95"``); ``spec`` names the text it came from."""
    where = f"bad policy {spec!r}: " if spec else ""
    try:
        q = float(text)
    except ValueError:
        raise InputError(f"{where}planning level {text!r} is not a number; use {POLICY_USAGE}") from None
    if q not in PLANNING_LEVELS:
        raise InputError(f"{where}planning level {q:g} is not forecast; use one of "
                         f"{', '.join(format_level(v) for v in PLANNING_LEVELS)}")
    return q


@dataclass(frozen=True)
class Reoptimization:
    """One model's re-optimization: ``kind`` in :data:`KINDS`, ``level`` its planning level
    (None for ``hold``; for ``full`` / ``grow`` without a level: the configured one)."""

    kind: str
    level: Level | None = None
    risk: Risk | None = None  # None: the environment's configured risk

    def __post_init__(self) -> None:
        if self.risk is not None and not isinstance(self.risk, Risk):
            raise InputError(f"Reoptimization: field 'risk' must be a Risk or None, got {self.risk!r}")
        if self.kind == "hold" and self.risk is not None:
            raise InputError(f"Reoptimization: field 'risk' must be None for hold, got {self.risk.label()!r}")
        if self.kind not in KINDS:
            raise InputError(f"Reoptimization: field 'kind' must be one of {', '.join(KINDS)}, "
                             f"got {self.kind!r}")
        if self.kind == "hold" and self.level is not None:
            raise InputError(f"Reoptimization: field 'level' must be None for hold, got {self.level!r}")

    @classmethod
    def parse(cls, text: str) -> Reoptimization:
        """``hold``, ``full``, ``full@0.9``, ``grow@0.95``, ``full@0.9+h0.7``."""
        body, plus, risk_text = text.strip().partition(RISK_SEPARATOR)
        kind, sep, level = body.partition("@")
        try:
            q = float(level) if sep else None
        except ValueError:
            raise InputError(f"bad re-optimization {text!r}: level {level!r} is not a number; "
                             f"use hold, full@q or grow@q") from None
        return cls(kind, q, parse_risk(risk_text, text) if plus else None)

    def label(self) -> str:
        text = self.kind if self.level is None else f"{self.kind}@{format_level(self.level)}"
        return text if self.risk is None else f"{text}{RISK_SEPARATOR}{self.risk.label()}"

    def __str__(self) -> str:
        return self.label()


@dataclass(frozen=True)
class PolicySpec:
    """A policy as a value (the grammar is in the module's docstring).

    ``kind``: a rule kind of :data:`RULE_KINDS`, ``per-model`` or ``learned``; ``every``: K of
    ``fixed`` / ``grow``; ``band``: (LOW, HIGH) of a ``threshold`` that names one (None: the
    rule's default band); ``level``: ``@q`` (None: the environment's); ``entries``: a per-model
    assignment's (K, q) per model; ``uri``: a learned policy's model URI as written; ``risk``: a
    rule's ``+RISK`` (None: the environment's; a neutral Risk is stored as None, so
    ``fixed:1+neutral`` and ``fixed:1`` are one value)."""

    kind: str
    every: int | None = None
    band: tuple[float, float] | None = None
    level: Level | None = None
    entries: tuple[Entry, ...] = ()
    uri: str = ""
    risk: Risk | None = None

    def __post_init__(self) -> None:
        if self.risk is not None:
            if not isinstance(self.risk, Risk):
                raise InputError(f"PolicySpec: field 'risk' must be a Risk or None, got {self.risk!r}")
            if self.kind not in RULE_KINDS:
                raise InputError(f"PolicySpec: {self.kind} takes no {RISK_SEPARATOR}RISK (a rule's risk for "
                                 f"every model), got {self.risk.label()!r}")
            if self.risk.neutral:
                object.__setattr__(self, "risk", None)
        if self.kind not in (*RULE_KINDS, "per-model", "learned"):
            raise UnknownNameError(f"unknown policy {self.kind!r}; valid: {POLICY_USAGE}, "
                                   f"per-model:K1@q1,..., learned:<model uri>")
        if (self.every is not None) != (self.kind in ("fixed", "grow")):
            raise InputError(f"PolicySpec: field 'every' is for fixed and grow only, got {self.every!r} "
                             f"for {self.kind}")
        if self.band is not None and self.kind != "threshold":
            raise InputError(f"PolicySpec: field 'band' is for threshold only, got {self.band!r}")
        if self.level is not None:
            if self.kind in (*_BARE, "per-model", "learned"):
                raise InputError(f"PolicySpec: {self.kind} takes no planning level, got {self.level!r}")
            check_level(self.level)
        if bool(self.entries) != (self.kind == "per-model"):
            raise InputError("PolicySpec: field 'entries' holds a per-model assignment's (K, q) per "
                             f"model, got {self.entries!r} for {self.kind}")
        if self.entries:
            object.__setattr__(self, "entries", tuple(_entry(e) for e in self.entries))
        if (self.kind == "learned") != bool(self.uri):
            raise InputError("learned:<uri> needs the MLflow model URI that 'atoll train' printed, or a "
                             "registered name such as atoll-trigger-core@champion" if self.kind == "learned"
                             else f"PolicySpec: field 'uri' is for learned policies only, got {self.uri!r}")

    @property
    def is_rule(self) -> bool:
        """A rule :func:`atoll.envs.policies.make_policy` builds (not per-model, not learned)."""
        return self.kind in RULE_KINDS

    @property
    def is_learned(self) -> bool:
        return self.kind == "learned"

    @property
    def is_per_model(self) -> bool:
        return self.kind == "per-model"

    @property
    def levels(self) -> tuple[Level, ...]:
        """Every level the spec names (a per-model assignment's per model; empty: the env's)."""
        if self.is_per_model:
            return tuple(e[1] for e in self.entries)
        return () if self.level is None else (self.level,)

    @property
    def entry_risks(self) -> tuple[Risk, ...] | None:
        """A per-model assignment's risk per model (neutral where an entry names none); None when
        no entry names one (every model takes the environment's configured risk)."""
        if not any(len(e) == 3 for e in self.entries):
            return None
        return tuple(e[2] if len(e) == 3 else Risk() for e in self.entries)

    def planning_level(self, default: Level) -> Level:
        """The level its environment is configured at: its ``@q``; a per-model assignment's most
        common level (ties: the highest); else ``default``."""
        if self.is_per_model:
            qs = self.levels
            return max(set(qs), key=lambda q: (qs.count(q), q))
        return default if self.level is None else self.level

    def __str__(self) -> str:
        if self.kind == "learned":
            return LEARNED_PREFIX + self.uri
        if self.kind == "per-model":
            return PER_MODEL_PREFIX + ",".join(_entry_text(e) for e in self.entries)
        body = self.kind
        if self.every is not None:
            body += f":{self.every}"
        if self.band is not None:
            body += f":{self.band[0]:g}:{self.band[1]:g}"
        if self.level is not None:
            body += f"@{format_level(self.level)}"
        return body if self.risk is None else f"{body}{RISK_SEPARATOR}{self.risk.label()}"


def _entry(e: Any) -> Entry:
    """An entry checked and normalized: (K, q), or (K, q, risk) with a non-neutral risk."""
    if not (isinstance(e, tuple) and len(e) in (2, 3) and (len(e) == 2 or isinstance(e[2], Risk))):
        raise InputError(f"PolicySpec: field 'entries' holds (K, q) or (K, q, Risk) per model, got {e!r}")
    if len(e) == 3 and not e[2].neutral:
        return int(e[0]), float(e[1]), e[2]
    return int(e[0]), float(e[1])


def _entry_text(e: Entry) -> str:
    text = f"{e[0]}@{format_level(e[1])}"
    return text + RISK_SEPARATOR + e[2].label() if len(e) == 3 else text


def _entry_parts(text: str, body: str) -> list[str]:
    """The entries' texts: a risk's part (h/s/f and a number) continues the previous entry's risk."""
    entries: list[str] = []
    for part in (p.strip() for p in body.split(",")):
        if not part:
            continue
        if part[0] in "hsf" and part[1:2] in "0123456789.":
            if not entries or RISK_SEPARATOR not in entries[-1]:
                raise InputError(f"policy {text!r}: {part!r} continues no entry's {RISK_SEPARATOR}RISK; use "
                                 f"{PER_MODEL_USAGE}")
            entries[-1] += "," + part
        else:
            entries.append(part)
    return entries


def _per_model(text: str) -> PolicySpec:
    body = text.removeprefix(PER_MODEL_PREFIX)
    entries: list[Entry] = []
    for whole in _entry_parts(text, body):
        part, plus, risk_text = whole.partition(RISK_SEPARATOR)
        risk = parse_risk(risk_text, text) if plus else None
        k, sep, q = part.partition("@")
        try:
            every, level = int(k), (float(q) if sep else math.nan)
        except ValueError:
            raise InputError(f"policy {text!r}: entry {part!r} is not K@q; use {PER_MODEL_USAGE}") from None
        if every < 1:
            raise InputError(f"policy {text!r}: entry {part!r} needs K >= 1 steps; use {PER_MODEL_USAGE}")
        if level not in PLANNING_LEVELS:
            raise InputError(f"policy {text!r}: {level!r} of entry {part!r} is not a planning level; use "
                             f"{', '.join(format_level(v) for v in PLANNING_LEVELS)}")
        entries.append((every, level) if risk is None else (every, level, risk))
    if not entries:
        raise InputError(f"policy {text!r} gives no K@q entries; use {PER_MODEL_USAGE}")
    return PolicySpec("per-model", entries=tuple(entries))


def parse_policy(text: str | PolicySpec) -> PolicySpec:
    """The :class:`PolicySpec` a policy's text names (a PolicySpec is returned as it is); an
    InputError (or UnknownNameError for an unknown kind) that names the text and the grammar."""
    if isinstance(text, PolicySpec):
        return text
    spec = text.strip()
    if spec.startswith(LEARNED_PREFIX):
        return PolicySpec("learned", uri=spec.removeprefix(LEARNED_PREFIX))
    if spec.startswith(PER_MODEL_PREFIX):
        return _per_model(spec)
    spec, plus, risk_text = spec.partition(RISK_SEPARATOR)
    risk = parse_risk(risk_text, text.strip()) if plus else None
    body, sep, level_text = spec.partition("@")
    level = parse_level(level_text, spec) if sep else None
    kind, *args = body.split(":")
    if kind not in RULE_KINDS:
        raise UnknownNameError(f"unknown policy {spec!r}; valid: {POLICY_USAGE}"
                               f"{', learned:<model uri>' if kind == 'learned' else ''}")
    try:
        if kind in ("fixed", "grow") and len(args) != 1 or kind == "threshold" and len(args) not in (0, 2) \
                or kind in _NO_ARGUMENT and args:
            raise ValueError("wrong number of arguments")
        if kind in _BARE and level is not None:
            raise ValueError(f"{kind} takes no planning level")
        every = int(args[0]) if kind in ("fixed", "grow") else None
        if every is not None and every < 1:
            raise ValueError(f"{kind}:K needs K >= 1 steps, got {every}")
        band = (float(args[0]), float(args[1])) if kind == "threshold" and args else None
    except ValueError as exc:
        raise InputError(f"bad policy {spec!r} ({exc}); use {POLICY_USAGE}") from exc
    return PolicySpec(kind, every=every, band=band, level=level, risk=risk)
