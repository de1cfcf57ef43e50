"""Jittered exponential backoff: the one used by agents (reconnection, status update
retries) and frameworks (reconnection)."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

# 2.0 ** 64 already exceeds any sane cap; a bound keeps the power from overflowing.
_MAX_EXPONENT = 64


@dataclass(frozen=True, slots=True)
class Backoff:
    """Delays that grow by `factor` from `initial` up to `maximum` seconds.

    Each delay is drawn from ``[(1 - jitter) * d, d]``: the jitter keeps agents
    that lost the same master from coming back in lockstep, and the lower bound
    keeps a retry from firing immediately.
    """

    initial: float = 1.0
    maximum: float = 10.0
    factor: float = 2.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        if not 0 < self.initial <= self.maximum:
            raise ValueError(f"need 0 < initial <= maximum, got {self.initial}, {self.maximum}")
        if self.factor < 1:
            raise ValueError(f"factor must be at least 1, got {self.factor}")
        if not 0 <= self.jitter <= 1:
            raise ValueError(f"jitter must be within [0, 1], got {self.jitter}")

    def delay(self, attempt: int, random_fraction: Callable[[], float] = random.random) -> float:
        """The delay before retry number `attempt` (0 for the first retry)."""
        ceiling = min(self.maximum, self.initial * self.factor ** min(attempt, _MAX_EXPONENT))
        return ceiling * (1 - self.jitter * random_fraction())
