"""Where a request's acceptance estimate starts: what the engine's earlier
requests of the same kind (greedy or sampling) saw.

The estimate sets window lengths (SpS's gamma, restarts, branch budgets).
Starting every request at a generic 0.8 makes the first rounds of a pair that
almost always agrees far too short. A seeded sampling request starts at the
generic prior, and teaches nothing: its windows must not depend on what ran
before it."""
from __future__ import annotations

GENERIC = 0.8
CEILING = 0.99     # a prior is never certainty: at 1.0 every window would run to the cap
LEARNING = 50      # tokens decided before a request's own rate outweighs the history


class AcceptancePrior:
    def __init__(self):
        self._rates = {}           # greedy? -> per-token acceptance over past requests

    def prior(self, request) -> float:
        if not request.timing_may_shape_windows:
            return GENERIC
        return self._rates.get(request.params.greedy, GENERIC)

    def learn(self, request, stats) -> None:
        """Move the history toward this request's rate, by how many tokens it decided."""
        decided = stats.accepted + stats.rejections
        if not request.timing_may_shape_windows or decided == 0:   # seeded, or nothing drafted (target mode)
            return
        rate = self._rates.get(request.params.greedy, GENERIC)
        rate += decided / (decided + LEARNING) * (stats.accepted / decided - rate)
        self._rates[request.params.greedy] = min(rate, CEILING)
