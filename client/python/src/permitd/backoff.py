"""Capped exponential backoff with "equal jitter", as a pure value.

The delay before retry ``n`` (from 0) is drawn from ``[ceiling / 2, ceiling]``
where ``ceiling = min(max_ms, initial_ms * 2^n)``; a server's ``Retry-After`` is
a floor. The random draw is passed in, so the schedule is testable. Same
schedule as the Rust client's ``backoff.rs`` and the TypeScript ``backoff.ts``.
"""

from __future__ import annotations

import math
from typing import Optional

#: Delay of the first retry, in ms.
DEFAULT_INITIAL_DELAY_MS = 50
#: Largest delay between two attempts, in ms.
DEFAULT_MAX_DELAY_MS = 2_000


class Backoff:
    def __init__(self, initial_ms: int = DEFAULT_INITIAL_DELAY_MS, max_ms: int = DEFAULT_MAX_DELAY_MS) -> None:
        self._retries = 0
        self._initial_ms = max(1, initial_ms)
        self._max_ms = max(self._initial_ms, max_ms)

    def ceiling_ms(self) -> int:
        """The nominal (un-jittered) delay of the next retry."""
        return min(self._max_ms, self._initial_ms * (1 << min(self._retries, 20)))

    def next_delay_ms(self, unit: float, retry_after_ms: Optional[int] = None) -> int:
        """The delay before the next retry; ``unit`` is a draw in ``[0, 1)``."""
        ceiling = self.ceiling_ms()
        self._retries += 1
        draw = min(1.0, max(0.0, unit)) if math.isfinite(unit) else 0.0
        half = ceiling // 2
        jittered = min(ceiling, half + math.floor((ceiling - half) * draw))
        return max(jittered, retry_after_ms or 0)
