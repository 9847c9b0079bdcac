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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from gymnasium import spaces

from atoll.envs.vocabulary import KINDS, Reoptimization
from atoll.solvers.errors import InputError

DEFAULT_ACTION_LEVELS: tuple[float, ...] = (0.7, 0.9, 0.95)
ACTION_KINDS: tuple[str, ...] = ("reopt", "binary")  # Fleet-v1's MultiDiscrete, Fleet-v0's MultiBinary


@dataclass(frozen=True)
class ActionCodec:
    """Codes <-> (kind, level) for a tuple of levels; ``levels[0]`` is the env's configured one."""

    levels: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.levels or len(set(self.levels)) != len(self.levels):
            raise InputError(f"ActionCodec: field 'levels' must be distinct planning levels, "
                             f"got {self.levels!r}")

    @classmethod
    def for_config(cls, planning_quantile: float, action_levels: Sequence[float]) -> ActionCodec:
        return cls((float(planning_quantile), *[float(q) for q in action_levels if q != planning_quantile]))

    @property
    def n(self) -> int:
        """Codes per model."""
        return 1 + 2 * len(self.levels)

    def space(self, n_models: int) -> spaces.MultiDiscrete:
        return spaces.MultiDiscrete(np.full(n_models, self.n, dtype=np.int64))

    def decode(self, code: int) -> Reoptimization:
        c = int(code)
        if not 0 <= c < self.n:
            raise ValueError(f"action code {c} is outside 0..{self.n - 1}")
        if c == 0:
            return Reoptimization("hold", None)
        j, r = divmod(c - 1, 2)
        return Reoptimization("full" if r == 0 else "grow", self.levels[j])

    def encode(self, kind: str, level: float | None = None) -> int:
        """The code of ``kind`` at ``level`` (None: the configured level)."""
        if kind == "hold":
            return 0
        if kind not in KINDS:
            raise InputError(f"unknown re-optimization kind {kind!r}; valid: {', '.join(KINDS)}")
        q = self.levels[0] if level is None else float(level)
        if q not in self.levels:
            raise InputError(f"planning level {q:g} is not one of this env's action levels "
                             f"{', '.join(f'{v:g}' for v in self.levels)}")
        return 1 + 2 * self.levels.index(q) + (0 if kind == "full" else 1)

    def relevel(self, codes: np.ndarray, level: float) -> np.ndarray:
        """``codes`` of the configured level (1 full, 2 grow, as the rules emit) moved to
        ``level``: a rule with ``@q`` acting in an env whose level 0 is another one."""
        full, grow = self.encode("full", level), self.encode("grow", level)
        out = np.asarray(codes).copy()
        out[np.asarray(codes) == 1] = full
        out[np.asarray(codes) == 2] = grow
        return out

    def names(self) -> list[str]:
        """Every code's label, in code order (``hold``, ``full@0.9``, ``grow@0.9``, ...)."""
        return [self.decode(c).label() for c in range(self.n)]
