"""What the master did, counted, for one aggregated log line a period.

Offers, launches and status updates come by the thousand a second on a busy master;
a log line each at info cost it more than the work itself. Each is logged at debug,
with its ids, and counted here; the process shell logs the counts as one info line
every period (`MasterCore.log_activity`), and only if something happened.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass(slots=True)
class Activity:
    offers: int = 0  # made
    accepted: int = 0  # offers used by an ACCEPT
    declined: int = 0  # offers declined
    launched: int = 0  # tasks
    updates: Counter[str] = field(default_factory=Counter)  # applied, by task state

    def take(self) -> dict[str, int]:
        """The counts since the last take (none that are 0), and start again from 0."""
        counts = {
            "offers": self.offers,
            "offers_accepted": self.accepted,
            "offers_declined": self.declined,
            "tasks_launched": self.launched,
            **{f"updates_{state.lower()}": n for state, n in sorted(self.updates.items())},
        }
        self.offers = self.accepted = self.declined = self.launched = 0
        self.updates = Counter()
        return {name: n for name, n in counts.items() if n}
