"""The prompt's guardrails through the local edge's real HTTP server, with a real origin process
(a second local edge in its own process, whose request log says what reached it): a masked
finding never leaves the edge, a blocked prompt reaches no model and no origin."""

from __future__ import annotations

import json
from typing import Any, Callable

from edgellm_local.doubles.faults import FaultPlan
from tests.edge.test_routing import origin, routed  # noqa: F401  (the module's fixtures: the origin process, the routed edge)
from tests.support.origin_process import OriginProcess

EMAIL = "jane.doe@example.com"
CARD = "4111 1111 1111 1111"
SECRET = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
POLICY = json.dumps({"dlp": {"email": "mask", "payment_card": "mask", "secret": "block"}})


def chat(content: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": content}], "max_tokens": 8, "temperature": 0}


def test_a_masked_finding_never_reaches_the_origin(routed: Callable[..., Any], origin: OriginProcess) -> None:
    client, faulty, _ = routed(FaultPlan(fail=1.0), GUARDRAILS=POLICY)  # the edge's binding fails: the origin answers
    before = len(origin.generation_requests())
    response = client.post("/v1/chat/completions", json=chat(f"mail {EMAIL} about card {CARD}"))
    assert response.status_code == 200, response.text
    assert response.headers["x-edgellm-route"].startswith("origin")
    assert response.headers["x-edgellm-guardrails"] == "masked; detectors=email,payment_card"
    [sent] = origin.generation_requests()[before:]
    assert EMAIL not in sent["body"] and "4111" not in sent["body"]
    assert json.loads(sent["body"])["messages"][0]["content"] == "mail [EMAIL_1] about card [PAYMENT_CARD_1]"


def test_a_blocked_prompt_reaches_neither_the_edge_model_nor_the_origin(routed: Callable[..., Any], origin: OriginProcess) -> None:
    client, faulty, _ = routed(FaultPlan(fail=1.0), GUARDRAILS=POLICY)
    before = len(origin.generation_requests())
    response = client.post("/v1/chat/completions", json=chat(f"use {SECRET}"))
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "content_filter" and "secret" in error["message"] and SECRET not in response.text
    assert faulty.calls == 0 and len(origin.generation_requests()) == before


def test_a_stream_from_llama_cpp_is_cut_by_the_answer_check_and_not_cached(start_edge: Callable[..., Any],
                                                                           make_deps: Callable[..., Any]) -> None:
    import httpx

    from edgellm.config import Config
    from edgellm.guardrails.policy import parse_policy
    from edgellm_local.doubles.guard import ScriptedGuard

    policy = parse_policy({"moderation": {"answer": {"S1": "block"}}})
    guard = ScriptedGuard(default="unsafe\nS1")  # every answer it is shown is violent
    deps = make_deps(config=Config(open_access=True, guardrails=policy, guard_window_tokens=4), guard=guard)
    server = start_edge(deps)
    body = {**chat("Tell me a story"), "max_tokens": 24, "stream": True}
    with httpx.Client(base_url=server.url, timeout=60) as client:
        for attempt in range(2):
            with client.stream("POST", "/v1/chat/completions", json=body) as response:
                assert response.status_code == 200
                assert response.headers["cf-aig-cache-status"] != "HIT"  # the cut answer was never stored
                lines = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
            assert lines[-1] != "[DONE]"
            events = [json.loads(line) for line in lines]
            assert events[-1]["error"]["code"] == "content_filter"
            finishes = [e["choices"][0]["finish_reason"] for e in events if e.get("choices") and e["choices"][0]["finish_reason"]]
            assert finishes == ["content_filter"]
            released = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e.get("choices"))
            assert released == ""  # the first window was the one refused: nothing of it left the edge
    assert len(guard.calls) == 2


def test_edgellm_dev_runs_the_guard_gguf_and_stops_it(tiny_model: Any, tmp_path: Any) -> None:
    """`--guard-model` through the real CLI: the tiny GGUF answers no verdict (random weights),
    so a moderated prompt meets GUARD_FAIL (closed: 503 guard_unavailable; open: answered), and a
    SIGTERM stops the edge with both runners (no hang; 143, as `edgellm dev` answers a SIGTERM)."""
    import signal

    import httpx

    policy = json.dumps({"moderation": {"prompt": {"S1": "block"}}})
    for mode, status in (("closed", 503), ("open", 200)):
        (tmp_path / mode).mkdir()
        edge = OriginProcess.start(tiny_model, tmp_path / mode,
                                   "--guard-model", str(tiny_model), "--var", f"GUARDRAILS={policy}", "--var", f"GUARD_FAIL={mode}",
                                   "--no-warm-up")
        try:
            response = httpx.post(f"{edge.url}/v1/chat/completions", json=chat("Hello"), timeout=120)
            assert response.status_code == status, response.text
            if status == 503:
                assert response.json()["error"]["code"] == "guard_unavailable" and response.headers["retry-after"]
            edge.process.send_signal(signal.SIGTERM)
            assert edge.process.wait(timeout=60) == 128 + signal.SIGTERM
        finally:
            edge.stop()
