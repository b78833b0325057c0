"""Where a request's acceptance estimate starts: what the engine's earlier requests of its kind (greedy, keyed or
unkeyed sampling) saw. The estimate sets window lengths (SpS's gamma, restarts, branch budgets), and a generic 0.8
for every request makes the first rounds of a pair that almost always agrees far too short."""
from __future__ import annotations

GENERIC = 0.8
CEILING = 0.99     # a prior is never certainty: at 1.0 every window would run to the cap
LEARNING = 50      # tokens decided before a request's own rate outweighs the history


class AcceptancePrior:
    def __init__(self):
        self._rates = {}           # Request.rule -> per-token acceptance over past requests

    def prior(self, request) -> float:
        return self._rates.get(request.rule, GENERIC)

    def learn(self, request, stats) -> None:
        """Move the history toward this request's rate, by how many tokens it decided."""
        decided = stats.accepted + stats.rejections
        if decided == 0:                         # nothing drafted (target mode)
            return
        rate = self._rates.get(request.rule, GENERIC)
        rate += decided / (decided + LEARNING) * (stats.accepted / decided - rate)
        self._rates[request.rule] = min(rate, CEILING)
