"""The Worker entrypoint: hands each request to the core through the Pyodide adapter, and
exports the `Flight` Durable Object (coalescing of identical misses, `edgellm.cache.coalescing`)."""

from workers import DurableObject, WorkerEntrypoint

from edgellm.runtime.pyodide import fetch, isolate_state
from edgellm.runtime.pyodide_durable import flight_object, serve_object


class Default(WorkerEntrypoint):
    async def fetch(self, request):
        return await fetch(request, self.env, self.ctx, isolate_state())


class Flight(DurableObject):
    """One generation shared by every identical cacheable miss (one object per cache key)."""

    def __init__(self, ctx, env):
        super().__init__(ctx, env)
        self.flight = flight_object(env, ctx)

    async def fetch(self, request):
        return await serve_object(self.flight, request)
