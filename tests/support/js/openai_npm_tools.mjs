// The openai npm SDK's tool loop against an edge, as its docs show it: chat.completions.create with
// tools -> tool_calls -> the tool's result as a `role: "tool"` message -> the final text answer, by
// hand (not streamed, then streamed and assembled from the deltas), then the SDK's own loop,
// chat.completions.runTools (not streamed, then streamed).
// usage: node openai_npm_tools.mjs <sdk prefix dir> <edge base URL> <model>
// prints one JSON line per loop: what the caller saw, step by step (never judged here).
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const [sdkDir, baseURL, model] = process.argv.slice(2);
const { default: OpenAI } = await import(pathToFileURL(join(sdkDir, "node_modules", "openai", "index.mjs")).href);
const client = new OpenAI({ baseURL: `${baseURL}/v1`, apiKey: "unused-locally", maxRetries: 0, timeout: 240_000,
  defaultHeaders: { "cf-aig-skip-cache": "true" } });

const out = (o) => console.log(JSON.stringify(o));
const parameters = { type: "object", properties: { city: { type: "string" } }, required: ["city"] };
const tools = [{ type: "function", function: { name: "get_weather", description: "The current weather in a city", parameters } }];
const RESULT = JSON.stringify({ city: "Paris", temperature_c: 21, sky: "sunny" });
const ask = { model, tools, temperature: 0, max_tokens: 80 };
const question = () => [{ role: "user", content: "What is the weather in Paris?" }];
const step = (finish, message) => ({
  finish, content: message.content ?? null,
  toolCalls: (message.tool_calls || []).map((c) => ({ id: c.id, type: c.type, name: c.function.name, arguments: c.function.arguments })),
});

async function streamed(messages) {
  // what a streaming caller builds from the chunks: content, calls by index, finish reason
  const stream = await client.chat.completions.create({ ...ask, messages, stream: true });
  let content = null, finish = null, chunks = 0;
  const calls = [];
  for await (const chunk of stream) {
    chunks += 1;
    const choice = chunk.choices[0];
    if (!choice) continue;
    const delta = choice.delta || {};
    if (typeof delta.content === "string") content = (content ?? "") + delta.content;
    for (const c of delta.tool_calls || []) {
      const call = (calls[c.index] ??= { id: "", type: "function", function: { name: "", arguments: "" } });
      if (c.id) call.id = c.id;
      if (c.function?.name) call.function.name += c.function.name;
      if (c.function?.arguments) call.function.arguments += c.function.arguments;
    }
    finish = choice.finish_reason ?? finish;
  }
  return { finish, chunks, message: { role: "assistant", content, tool_calls: calls.length ? calls : undefined } };
}

async function byHand(stream) {
  const messages = question(), steps = [], executed = [];
  for (let turn = 0; turn < 4; turn += 1) {  // a loop that never answers stops here, and says so
    let finish, message;
    if (stream) ({ finish, message } = await streamed(messages));
    else ({ finish_reason: finish, message } = (await client.chat.completions.create({ ...ask, messages })).choices[0]);
    steps.push(step(finish, message));
    if (finish !== "tool_calls") break;
    messages.push({ role: "assistant", content: message.content ?? null, tool_calls: message.tool_calls });
    for (const call of message.tool_calls) {
      executed.push(JSON.parse(call.function.arguments));
      messages.push({ role: "tool", tool_call_id: call.id, content: RESULT });
    }
  }
  return { steps, executed };
}

async function sdkLoop(stream) {
  const executed = [];
  const runner = client.chat.completions.runTools({
    model, temperature: 0, max_tokens: 80, messages: question(), stream,
    tools: [{ type: "function", function: { name: "get_weather", description: "The current weather in a city", parameters,
      parse: JSON.parse, function: (args) => { executed.push(args); return RESULT; } } }],
  }, { maxChatCompletions: 4 });  // an option of the runner, not of the request
  const text = await runner.finalContent();
  const steps = runner.allChatCompletions().map((c) => step(c.choices[0].finish_reason, c.choices[0].message));
  return { steps, executed, text };
}

async function run(loop, body) {  // an error the SDK raises is reported as part of what the caller saw
  try { out({ loop, ...(await body()) }); } catch (error) { out({ loop, error: `${error.name}: ${error.message}` }); }
}
await run("create", () => byHand(false));
await run("create-stream", () => byHand(true));
await run("runTools", () => sdkLoop(false));
await run("runTools-stream", () => sdkLoop(true));
