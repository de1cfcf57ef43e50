"""Reading a master's GET /metrics in tests, with Prometheus' own parser."""

from __future__ import annotations

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

Labels = dict[str, str]
Samples = dict[str, list[tuple[Labels, float]]]

# Exported beside mesolite_* by prometheus_client's standard collectors.
STANDARD_PREFIXES = ("process_", "python_")


async def scrape(http_address: str) -> Samples:
    """Every sample of the master's /metrics, by sample name."""
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://{http_address}/metrics") as response,
    ):
        response.raise_for_status()
        assert response.content_type == "text/plain"
        text = await response.text()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        assert family.documentation, f"{family.name} has no help string"
        for s in family.samples:
            samples.setdefault(s.name, []).append((s.labels, s.value))
    return samples


def value(samples: Samples, metric: str, /, **labels: str) -> float:
    """The one sample of `metric` whose labels include `labels`."""
    found = [v for got, v in samples.get(metric, []) if labels.items() <= got.items()]
    assert len(found) == 1, f"{metric}{labels}: {found} in {samples.get(metric)}"
    return found[0]


def total(samples: Samples, name: str) -> float:
    return sum(v for _, v in samples.get(name, []))
