"""The moderation guard: the parse of Llama Guard 3's answers, the Workers AI adapter over the
AI binding's stand-in (driven by the scripted guard double), and the local llama.cpp adapter's
prompt and parse. No Llama Guard GGUF is in any registry package, so the local adapter runs on
the tiny test GGUF: its plumbing is real, its verdicts are not (random weights answer text that
is no verdict, which is exactly the unparsable case)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from edgellm.guardrails.moderation import CATEGORIES, SAFE, UnparsableVerdict, guard_messages, parse_verdict
from edgellm.ports import CapacityExceeded, GuardError, InvalidModelInput, Verdict
from edgellm_local.doubles.guard import ScriptedGuard
from edgellm_local.llama.guard import LlamaCppGuard, llama_guard_prompt, template_lists_categories
from tests.support import fake_pyodide as fp


@pytest.mark.parametrize("answer,verdict", [
    ("safe", SAFE),
    ("safe\n", SAFE),
    ("\n\nsafe", SAFE),
    ("unsafe\nS1", Verdict(False, ("S1",))),
    ("unsafe\nS10,S1", Verdict(False, ("S1", "S10"))),
    ("unsafe\nS2, S14 ,S2", Verdict(False, ("S2", "S14"))),
    ({"safe": True, "categories": []}, SAFE),
    ({"safe": True}, SAFE),
    ({"safe": False, "categories": ["S10", "S9"]}, Verdict(False, ("S9", "S10"))),
])
def test_both_answer_forms_parse(answer, verdict):
    assert parse_verdict(answer) == verdict


@pytest.mark.parametrize("answer", [
    "", "Safe", "unsafe", "unsafe\n", "unsafe\nS15", "unsafe\nS0", "unsafe\nviolence", "safe\nS1",
    "unsafe\nS1\nS2", "I cannot help with that", "safe safe",
    {"safe": "yes", "categories": []}, {"safe": False, "categories": []}, {"safe": True, "categories": ["S1"]},
    {"safe": False, "categories": "S1"}, {"safe": False, "categories": [1]}, {"categories": ["S1"]},
    42, None, ["safe"],
])
def test_anything_else_is_unparsable_and_a_guard_error(answer):
    with pytest.raises(UnparsableVerdict) as caught:
        parse_verdict(answer)
    assert isinstance(caught.value, GuardError)


def test_guard_messages_alternate_from_the_user():
    assert guard_messages([
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "hi"},
        {"role": "user", "content": [{"type": "text", "text": "there"}]},
        {"role": "assistant", "content": "hello"},
        {"role": "tool", "content": "42"},
        {"role": "assistant", "content": ""},
    ]) == [
        {"role": "user", "content": "You are terse.\n\nhi\n\nthere"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "42"},
    ]
    assert guard_messages([{"role": "assistant", "content": "an answer"}])[0]["role"] == "user"
    with pytest.raises(ValueError):
        guard_messages([{"role": "user", "content": ""}])


# --- Workers AI: @cf/meta/llama-guard-3-8b over the AI binding's stand-in ---------------------

@pytest.fixture
def guard_over_binding():
    with fp.installed():
        from edgellm.runtime import pyodide_guard

        def make(double: ScriptedGuard):
            binding = fp.JsAi(double)
            return pyodide_guard.WorkersAIGuard(binding), binding
        yield make


async def test_workers_ai_guard_sends_the_contract_and_parses_the_text_form(guard_over_binding):
    double = ScriptedGuard(rules=[("bomb", "unsafe\nS9,S1")])
    guard, binding = guard_over_binding(double)
    assert await guard.classify([{"role": "user", "content": "how do I bake bread"}]) == SAFE
    verdict = await guard.classify([{"role": "system", "content": "be kind"}, {"role": "user", "content": "build a bomb"}])
    assert verdict == Verdict(False, ("S1", "S9"))
    model, inputs, options = binding.calls[-1]
    assert model == "@cf/meta/llama-guard-3-8b" and options is None
    assert inputs == {"messages": [{"role": "user", "content": "be kind\n\nbuild a bomb"}], "temperature": 0, "max_tokens": 32}


async def test_workers_ai_guard_parses_the_object_form_and_judges_the_answer(guard_over_binding):
    double = ScriptedGuard(rules=[("insult", {"safe": False, "categories": ["S10"]})], default={"safe": True, "categories": []})
    guard, binding = guard_over_binding(double)
    conversation = [{"role": "user", "content": "say something"}, {"role": "assistant", "content": "an insult"}]
    assert await guard.classify(conversation) == Verdict(False, ("S10",))
    assert [m["role"] for m in binding.calls[-1][1]["messages"]] == ["user", "assistant"]
    assert await guard.classify([{"role": "user", "content": "say something"}]) == SAFE


@pytest.mark.parametrize("answer", ["I'm sorry", {"verdict": "ok"}, "unsafe\nS99"])
async def test_workers_ai_guard_unparsable_answer_is_a_guard_error(guard_over_binding, answer):
    guard, _ = guard_over_binding(ScriptedGuard(default=answer))
    with pytest.raises(GuardError):
        await guard.classify([{"role": "user", "content": "x"}])


async def test_workers_ai_guard_binding_failures_keep_their_kind(guard_over_binding):
    guard, _ = guard_over_binding(ScriptedGuard(fail=CapacityExceeded("3040: Capacity temporarily exceeded, please try again.")))
    with pytest.raises(CapacityExceeded) as caught:
        await guard.classify([{"role": "user", "content": "x"}])
    assert caught.value.retryable


async def test_the_double_refuses_what_workers_ai_s_schema_refuses():
    double = ScriptedGuard()
    for bad in ({"messages": []}, {"messages": [{"role": "assistant", "content": "x"}]},
                {"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]},
                {"messages": [{"role": "user", "content": "a"}], "stream": True}):
        with pytest.raises(InvalidModelInput, match="5006"):
            await double.run("@cf/meta/llama-guard-3-8b", bad)
    assert double.calls == []


async def test_a_held_guard_is_a_timeout_the_caller_chooses():
    gate = asyncio.Event()
    double = ScriptedGuard(gate=gate)
    call = asyncio.ensure_future(double.classify([{"role": "user", "content": "x"}]))
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(asyncio.shield(call), timeout=0.01)
    assert len(double.calls) == 1 and not call.done()
    gate.set()
    assert await call == SAFE


# --- the local adapter: Llama Guard 3's prompt, llama.cpp, the same parse ---------------------

def test_the_prompt_lists_the_taxonomy_and_judges_the_last_side():
    prompt = llama_guard_prompt([{"role": "user", "content": "hi"}])
    for code, name in CATEGORIES.items():
        assert f"{code}: {name}." in prompt
    assert "ONLY THE LAST User message" in prompt and "User: hi" in prompt
    answer = llama_guard_prompt([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}])
    assert "ONLY THE LAST Agent message" in answer and answer.index("User: hi") < answer.index("Agent: yo")
    assert answer.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")


def test_the_route_follows_the_gguf_s_template():
    guard_template = "{% ... %}<BEGIN UNSAFE CONTENT CATEGORIES>\nS1: Violent Crimes.{% ... %}"
    assert template_lists_categories(guard_template)
    assert not template_lists_categories("{% for message in messages %}...")
    assert not template_lists_categories(None)
    messages = [{"role": "user", "content": "hi"}]
    route, body = LlamaCppGuard(runner=None, use_template=True).request(messages)
    assert route == "chat" and body["messages"] == [{"role": "user", "content": "hi"}] and body["temperature"] == 0
    route, body = LlamaCppGuard(runner=None, use_template=False).request(messages)
    assert route == "complete" and body["prompt"] == llama_guard_prompt(messages)


async def test_the_local_guard_runs_on_llama_cpp_and_refuses_a_non_verdict(tmp_path: Path):
    """The tiny GGUF is no guard: its template is not Llama Guard's, so the prompt goes whole
    through the completion route, and its random text is no verdict: a GuardError, never a
    verdict made up."""
    from edgellm_local.llama.runner import LlamaCppRunner
    from tests.support.tiny_gguf import write_tiny_gguf

    # the guard prompt (the whole taxonomy) is ~700 tokens of the tiny byte-level vocabulary
    model = write_tiny_gguf(tmp_path / "tiny-2k.gguf", n_ctx=2048)
    runner = LlamaCppRunner(model, n_ctx=2048, n_parallel=1, threads=1).load()
    try:
        guard = LlamaCppGuard.for_model(runner)
        assert guard.use_template is False
        with pytest.raises(UnparsableVerdict, match="neither 'safe' nor 'unsafe'"):
            await guard.classify([{"role": "user", "content": "hello"}])
    finally:
        runner.close()


async def test_a_conversation_longer_than_the_guard_s_context_is_a_guard_error(tiny_runner):
    """llama.cpp's refusal (the 512-token slots of the shared test runner) is a guard failure
    that `GUARD_FAIL` decides, not an answer."""
    guard = LlamaCppGuard.for_model(tiny_runner)
    with pytest.raises(GuardError, match="exceeds the available context"):
        await guard.classify([{"role": "user", "content": "hello " * 400}])
