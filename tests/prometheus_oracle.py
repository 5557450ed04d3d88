"""`prometheus_client` as the oracle of the edge's own Prometheus text: the official client
renders the same families (a Collector over the core's `Family` values), and the tests hold the
core's writer's text and the client's equal through the client's parser. Only tests use it: both
runtimes serve `/metrics` through the core's writer (`edgellm.telemetry.exposition`)."""

from __future__ import annotations

from typing import Iterator

from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector, CollectorRegistry

from edgellm.telemetry.exposition import Family


class FamiliesCollector(Collector):
    """`prometheus_client`'s view of the core's families, as read for one scrape."""

    def __init__(self, families: list[Family]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        for family in self.families:
            metric = Metric(family.name, family.help, family.type)
            for suffix, labels, value in family.samples:
                metric.add_sample(family.name + suffix, labels, value)
            yield metric


class PrometheusExposition:
    """The families through the official client. Its content type is the one the client's own
    handler sends for this text (`choose_encoder` without a 1.0.0 `Accept`): the names are all
    legacy ones, so the text is the 0.0.4 format, as the core's writer says of the same text."""

    def render(self, families: list[Family]) -> tuple[bytes, str]:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(FamiliesCollector(families))
        return generate_latest(registry), CONTENT_TYPE_PLAIN_0_0_4
