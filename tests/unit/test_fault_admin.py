"""`GET|POST /admin/faults` as a core route over the `FaultControl` port: off (404) without an
injector, admin-authenticated like the other admin routes, errors in the OpenAI shape."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any, Mapping

from edgellm.app import handle
from edgellm.config import Config
from edgellm.deps import Deps
from edgellm.http import Request, Response
from edgellm_local.doubles.faults import FaultAdmin, FaultyAI
from edgellm_local.doubles.scripted import ScriptedAI

ADMIN = "s3cret-admin"


@dataclass
class RecordingFaults:
    plans: list[dict[str, Any]] = field(default_factory=list)

    def state(self) -> dict[str, Any]:
        return {"plan": self.plans[-1] if self.plans else {}, "calls": len(self.plans), "closed": 0, "injected": {}}

    def replace_plan(self, plan: Mapping[str, Any]) -> None:
        if "bad" in plan:
            raise TypeError("unexpected keyword argument 'bad'")
        self.plans.append(dict(plan))


def deps_with(faults: Any, admin_token: str | None = ADMIN) -> Deps:
    return Deps(config=Config(open_access=True, admin_token=admin_token), ai=ScriptedAI(), kv=None, faults=faults,
                log=logging.getLogger("edgellm.test"))


async def answer(method: str, deps: Deps, body: bytes = b"", token: str | None = ADMIN) -> tuple[Response, Any]:
    headers = {"content-type": "application/json", **({"authorization": f"Bearer {token}"} if token else {})}
    response = await handle(Request(method, "http://edge.test/admin/faults", headers, body), deps)
    return response, json.loads(response.body)


async def test_without_an_injector_the_route_is_not_there() -> None:
    response, data = await answer("GET", deps_with(None))
    assert response.status == 404 and data["error"]["code"] == "route_not_found"


async def test_it_needs_the_admin_token_and_is_off_without_one() -> None:
    response, data = await answer("GET", deps_with(RecordingFaults()), token="wrong")
    assert response.status == 401 and data["error"]["type"] == "authentication_error"
    response, data = await answer("GET", deps_with(RecordingFaults(), admin_token=None))
    assert response.status == 404 and "admin token" in data["error"]["message"]


async def test_get_reads_and_post_replaces_the_plan() -> None:
    faults = RecordingFaults()
    deps = deps_with(faults)
    response, data = await answer("POST", deps, b'{"stall": 0.5, "after": 2}')
    assert response.status == 200 and data == {"object": "faults", "plan": {"stall": 0.5, "after": 2}, "calls": 1, "closed": 0, "injected": {}}
    response, data = await answer("POST", deps)  # an empty body: the default plan back
    assert faults.plans[-1] == {}
    response, data = await answer("GET", deps)
    assert response.status == 200 and data["calls"] == 2


async def test_a_bad_plan_is_a_400_in_the_openai_shape() -> None:
    faults = RecordingFaults()
    for body in (b'{"bad": 1}', b"[1, 2]", b"{nope"):
        response, data = await answer("POST", deps_with(faults), body)
        assert response.status == 400 and set(data["error"]) == {"message", "type", "param", "code", "request_id"}
        assert data["error"]["type"] == "invalid_request_error"
    assert faults.plans == []


async def test_the_local_injector_keeps_the_routes_json() -> None:
    faulty = FaultyAI(ScriptedAI())
    deps = deps_with(FaultAdmin(faulty))
    response, data = await answer("POST", deps, b'{"fail": 1, "models": ["@cf/a"]}')
    assert response.status == 200 and faulty.plan.fail == 1 and faulty.plan.models == ("@cf/a",)
    assert data["object"] == "faults" and data["plan"]["fail"] == 1 and data["plan"]["models"] == ["@cf/a"]
    assert set(data) == {"object", "plan", "calls", "closed", "injected"} and data["injected"]["fail"] == 0
