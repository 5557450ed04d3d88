"""The Worker entrypoint: hands each request to the core through the Pyodide adapter."""

from workers import WorkerEntrypoint

from edgellm.runtime.pyodide import fetch, isolate_state


class Default(WorkerEntrypoint):
    async def fetch(self, request):
        return await fetch(request, self.env, self.ctx, isolate_state())
