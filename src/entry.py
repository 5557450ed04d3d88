"""The Worker entrypoint: hands each request to the core through the Pyodide adapter, and
exports the Durable Objects: `Flight` (coalescing of identical misses, `edgellm.cache.coalescing`),
`Conversation` (the Responses API's stored conversations) and `Router` (a pool of origin replicas'
view, `edgellm.routing.router`)."""

from workers import DurableObject, WorkerEntrypoint

from edgellm.runtime.pyodide import fetch, isolate_state
from edgellm.runtime.pyodide_durable import serve_object
from edgellm.runtime.pyodide_flight import flight_object
from edgellm.runtime.pyodide_conversations import ConversationHost
from edgellm.runtime.pyodide_router import router_object


class Default(WorkerEntrypoint):
    async def fetch(self, request):
        return await fetch(request, self.env, self.ctx, isolate_state())


class Conversation(DurableObject):
    """One conversation's stored responses (the Responses API), in this object's SQLite storage."""

    def __init__(self, ctx, env):
        super().__init__(ctx, env)
        self.host = ConversationHost(ctx, env)

    async def fetch(self, request):
        return await self.host.fetch(request)


class Flight(DurableObject):
    """One generation shared by every identical cacheable miss (one object per cache key)."""

    def __init__(self, ctx, env):
        super().__init__(ctx, env)
        self.flight = flight_object(env, ctx)

    async def fetch(self, request):
        return await serve_object(self.flight, request)


class Router(DurableObject):
    """One pool of origin replicas: where each request should go (`edgellm.routing.router`)."""

    def __init__(self, ctx, env):
        super().__init__(ctx, env)
        self.router = router_object(env, ctx)

    async def fetch(self, request):
        return await serve_object(self.router, request)
