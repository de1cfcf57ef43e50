"""Jittered exponential backoff between reconnection attempts."""

from __future__ import annotations

import random
from collections.abc import Callable


class Backoff:
    """Delays that double from `initial` up to `maximum`, each drawn from the upper half of
    its ceiling: jitter keeps frameworks that lost the same master from reconnecting in
    lockstep, and the lower bound keeps a flapping master from being hammered."""

    def __init__(
        self, initial: float, maximum: float, rand: Callable[[], float] = random.random
    ) -> None:
        if initial <= 0 or maximum < initial:
            raise ValueError(f"need 0 < initial <= maximum, got {initial}, {maximum}")
        self._initial = initial
        self._maximum = maximum
        self._rand = rand
        self._attempt = 0

    def next_delay(self) -> float:
        # The exponent is capped so that 2**attempt never overflows a float.
        ceiling = min(self._maximum, self._initial * 2.0 ** min(self._attempt, 64))
        self._attempt += 1
        return ceiling * (0.5 + self._rand() / 2)

    def reset(self) -> None:
        self._attempt = 0
