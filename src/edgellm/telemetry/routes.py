"""`GET /metrics`: this isolate's metrics in the Prometheus text format.

Behind the admin token (`Authorization: Bearer ADMIN_TOKEN`, as Prometheus' `authorization`
scrape option sends it) unless the edge says they are open (`METRICS_OPEN`: the local edge on a
loopback address). On Cloudflare each isolate answers with its own counts: a scrape reaches one
isolate, so the numbers are a sample of the fleet, never its sum (docs/observability.md).
"""

from __future__ import annotations

from ..cache.admin import require_admin
from ..deps import Deps
from ..context import RequestContext
from ..http import Request, Response
from .exposition import CONTENT_TYPE, families, render_text


async def get_metrics(request: Request, deps: Deps, ctx: RequestContext) -> Response:
    if not deps.config.metrics_open:
        require_admin(request, deps, ctx)
    # the core's own writer on both runtimes: Workers have no prometheus_client, and one writer is one text
    return Response(200, {"content-type": CONTENT_TYPE, "cache-control": "no-store"}, render_text(families(deps)).encode())
