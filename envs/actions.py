"""Which re-optimization each model gets: the ``atoll/Fleet-v1`` action.

Per model one integer code (a ``MultiDiscrete`` entry of ``1 + 2 L`` values, L planning levels):

==========  ==============================================================================
code        meaning
==========  ==============================================================================
0           ``hold``: the model's instances stay as they are
1 + 2 j     ``full`` at level j: re-solve the model freely for its level-j planning demand
2 + 2 j     ``grow`` at level j: re-solve with the model's running instances kept (each
            template's count may only rise), for its level-j planning demand
==========  ==============================================================================

Level 0 is always the environment's configured ``planning_quantile``, so code 1 is "re-plan
fully at the configured level": the ``atoll/Fleet-v0`` action's bit 1. A 0/1 vector therefore
means the same in both versions, and the rule policies (which emit 0/1) behave exactly as before.
The other levels are ``FleetConfig.action_levels`` without the configured one, in their order.

``grow`` is what the ``MultiBinary`` action could not say — "add capacity if the forecast needs
it, but release none": releasing capacity as demand dips and buying it back minutes later is
where re-planning loses goodput (each re-bought instance serves only after its start-up).

**The risk a re-plan takes** (``atoll/Fleet-v4``, ``action="risk"``): each re-optimization also
chooses one of R risk presets (:class:`~atoll.solvers.problem.Risk`: headroom, spread over spot
pools, on-demand floor), applied to that model alone in the re-plan's allocation ILP. Per model
``1 + 2 L R`` codes:

==============  ============================================================================
code            meaning
==============  ============================================================================
0               ``hold``
1 + 2 (r L + j) ``full`` at level j taking risk preset r
2 + 2 (r L + j) ``grow`` at level j taking risk preset r
==============  ============================================================================

Preset 0 is always the environment's configured risk (``FleetConfig.risk``, neutral by default),
so codes 0 .. 2 L mean what they mean in ``atoll/Fleet-v1``, and a rule's 0/1/2 codes take the
configured risk. The other presets are the market's menu (:data:`RISK_MENUS`) without the
configured one, in its order. The menus were chosen from the risk benchmark's validation days
(``benchmarks/risk.py``, core, days 8-10, the rule ``fixed:1`` in the calibration world): headroom
0.85 and 0.7 cut the effective cost (node $ + lost tokens) to 0.84x and 0.63x of the neutral plan's
on spot; a spread of 0.5 alone changed nothing there; under ``hedged``, among the spread and floor
variants only ``h0.85,s0.5`` beat the neutral plan (0.88x; ``f0.3`` cost 1.20x), so it is the
hedged menu's fourth preset.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium import spaces

from atoll.envs.vocabulary import KINDS, Reoptimization
from atoll.solvers.errors import InputError
from atoll.solvers.problem import NEUTRAL_RISK, Risk

DEFAULT_ACTION_LEVELS: tuple[float, ...] = (0.7, 0.9, 0.95)
# Fleet-v1's MultiDiscrete, Fleet-v0's MultiBinary, Fleet-v4's MultiDiscrete with a risk preset
ACTION_KINDS: tuple[str, ...] = ("reopt", "binary", "risk")
# The risk presets a Fleet-v4 re-plan chooses from, per market (the module's docstring says why
# these); a market not named here gets the default's.
RISK_MENUS: dict[str, tuple[str, ...]] = {
    "default": ("neutral", "h0.85", "h0.7"),
    "hedged": ("neutral", "h0.85", "h0.7", "h0.85,s0.5"),
}


def risk_menu(availability: str, chosen: Sequence[Risk] = ()) -> tuple[Risk, ...]:
    """The risk presets of a ``risk`` action: ``chosen`` (``FleetConfig.risk_menu``) when given,
    else ``availability``'s market's (:data:`RISK_MENUS`)."""
    if chosen:
        return tuple(chosen)
    return tuple(Risk.parse(r) for r in RISK_MENUS.get(availability, RISK_MENUS["default"]))


@dataclass(frozen=True)
class ActionCodec:
    """Codes <-> (kind, level, risk) for a tuple of levels and of risk presets; ``levels[0]`` and
    ``risks[0]`` are the env's configured ones (one risk: the ``Fleet-v1`` codes, no risk chosen)."""

    levels: tuple[float, ...]
    risks: tuple[Risk, ...] = (NEUTRAL_RISK,)

    def __post_init__(self) -> None:
        if not self.levels or len(set(self.levels)) != len(self.levels):
            raise InputError(f"ActionCodec: field 'levels' must be distinct planning levels, "
                             f"got {self.levels!r}")
        if not self.risks or not all(isinstance(r, Risk) for r in self.risks) \
                or len(set(self.risks)) != len(self.risks):
            raise InputError(f"ActionCodec: field 'risks' must be distinct Risk presets, got {self.risks!r}")

    @classmethod
    def for_config(cls, planning_quantile: float, action_levels: Sequence[float], risk: Risk = NEUTRAL_RISK,
                   menu: Sequence[Risk] = ()) -> ActionCodec:
        """The codec of an env at ``planning_quantile`` with ``action_levels``; with a risk ``menu``
        (``action="risk"``) its presets are ``risk`` (the configured one) then the menu without it."""
        levels = (float(planning_quantile), *[float(q) for q in action_levels if q != planning_quantile])
        return cls(levels, (risk, *[r for r in menu if r != risk]))

    @property
    def n(self) -> int:
        """Codes per model."""
        return 1 + 2 * len(self.levels) * len(self.risks)

    def space(self, n_models: int) -> spaces.MultiDiscrete:
        return spaces.MultiDiscrete(np.full(n_models, self.n, dtype=np.int64))

    def decode(self, code: int) -> Reoptimization:
        c = int(code)
        if not 0 <= c < self.n:
            raise ValueError(f"action code {c} is outside 0..{self.n - 1}")
        if c == 0:
            return Reoptimization("hold", None)
        combo, kind = divmod(c - 1, 2)
        r, j = divmod(combo, len(self.levels))
        # preset 0 is the configured risk: None, as a rule's re-plan takes it
        return Reoptimization("full" if kind == 0 else "grow", self.levels[j], self.risks[r] if r else None)

    def encode(self, kind: str, level: float | None = None, risk: Risk | None = None) -> int:
        """The code of ``kind`` at ``level`` taking ``risk`` (None: the configured level / risk)."""
        if kind == "hold":
            return 0
        if kind not in KINDS:
            raise InputError(f"unknown re-optimization kind {kind!r}; valid: {', '.join(KINDS)}")
        q = self.levels[0] if level is None else float(level)
        if q not in self.levels:
            raise InputError(f"planning level {q:g} is not one of this env's action levels "
                             f"{', '.join(f'{v:g}' for v in self.levels)}")
        rk = self.risks[0] if risk is None else risk
        if rk not in self.risks:
            raise InputError(f"risk {rk.label()!r} is not one of this env's risk presets "
                             f"{', '.join(r.label() for r in self.risks)}; use the atoll/Fleet-v4 action "
                             f"(action='risk') with a preset of its market's menu")
        combo = self.risks.index(rk) * len(self.levels) + self.levels.index(q)
        return 1 + 2 * combo + (0 if kind == "full" else 1)

    def relevel(self, codes: np.ndarray, level: float, risk: Risk | None = None) -> np.ndarray:
        """``codes`` of the configured level (1 full, 2 grow, as the rules emit) moved to
        ``level`` (and ``risk``): a rule with ``@q`` (``+RISK``) acting in an env whose level 0
        (preset 0) is another one."""
        full, grow = self.encode("full", level, risk), self.encode("grow", level, risk)
        out = np.asarray(codes).copy()
        out[np.asarray(codes) == 1] = full
        out[np.asarray(codes) == 2] = grow
        return out

    def names(self) -> list[str]:
        """Every code's label, in code order (``hold``, ``full@0.9``, ``grow@0.9``, ...)."""
        return [self.decode(c).label() for c in range(self.n)]


def decode_action(codec: ActionCodec, action: Any, models: Sequence[str], binary: bool = False
                  ) -> list[Reoptimization]:
    """The re-optimization each of ``models`` gets from ``action``: ``codec``'s codes, or with
    ``binary`` the ``atoll/Fleet-v0`` bits (1: code 1); ValueError naming the encoding."""
    a = np.asarray(action)
    m = len(models)
    names = ", ".join(models)
    if binary:
        if a.shape != (m,) or not np.all((a == 0) | (a == 1)):
            raise ValueError(f"action must be MultiBinary({m}): {m} values of 0 or 1, one per model "
                             f"({names}); got {action!r}")
    elif a.shape != (m,) or not np.all(np.isfinite(a.astype(float))) or not np.all(a == np.round(a)) \
            or not np.all((a >= 0) & (a < codec.n)):
        codes = ", ".join(f"{i}={n}" for i, n in enumerate(codec.names()))
        raise ValueError(f"action must be MultiDiscrete([{codec.n}] * {m}): one code per model "
                         f"({names}) among {codes}; got {action!r}")
    return [codec.decode(int(v)) for v in a]
