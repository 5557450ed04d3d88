// The Vercel AI SDK's tool loop and structured output, used as its docs show, against an edge:
// generateText with a tool and multi-step (stopWhen: stepCountIs), the same streamed (streamText),
// and generateObject with a zod schema. One provider per run: "openai" (@ai-sdk/openai, its default
// `openai(model)` speaks the Responses API), "openai-chat" (the same package's `openai.chat(model)`)
// or "openai-compatible" (@ai-sdk/openai-compatible, chat completions).
// usage: node vercel_ai_sdk_tools.mjs <sdk prefix dir> <edge base URL> <model> <provider>
// prints one JSON line per call: what the caller saw, step by step (never judged here).
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const [sdkDir, baseURL, modelId, provider] = process.argv.slice(2);
const load = (pkg, file = "dist/index.js") => import(pathToFileURL(join(sdkDir, "node_modules", pkg, file)).href);
const { generateText, streamText, generateObject, tool, stepCountIs } = await load("ai");
const { z } = await load("zod", "index.js");

async function makeModel() {
  if (provider === "openai-compatible") {
    const { createOpenAICompatible } = await load("@ai-sdk/openai-compatible");
    // supportsStructuredOutputs: the edge honours json_schema; without it the provider sends a bare
    // json_object (the schema dropped, with a warning) and a small model answers `{}`.
    return createOpenAICompatible({ name: "edgellm", baseURL: `${baseURL}/v1`, apiKey: "unused-locally",
      supportsStructuredOutputs: true })(modelId);
  }
  const { createOpenAI } = await load("@ai-sdk/openai");
  const openai = createOpenAI({ baseURL: `${baseURL}/v1`, apiKey: "unused-locally" });
  return provider === "openai-chat" ? openai.chat(modelId) : openai(modelId);
}

const model = await makeModel();
const out = (o) => console.log(JSON.stringify(o));
const executed = [];
const getWeather = tool({
  description: "The current weather in a city",
  inputSchema: z.object({ city: z.string() }),
  execute: async (input) => {
    executed.push(input);
    return { city: "Paris", temperature_c: 21, sky: "sunny" };
  },
});
const ask = {
  model, tools: { get_weather: getWeather }, stopWhen: stepCountIs(4), temperature: 0, maxOutputTokens: 80,
  maxRetries: 0, headers: { "cf-aig-skip-cache": "true" }, prompt: "What is the weather in Paris?",
};
const steps = (all) => all.map((s) => ({
  finish: s.finishReason, text: s.text,
  toolCalls: s.toolCalls.map((c) => ({ name: c.toolName, input: c.input, id: c.toolCallId, invalid: Boolean(c.invalid) })),
  toolResults: s.toolResults.map((r) => ({ name: r.toolName, id: r.toolCallId })),
}));

const generated = await generateText(ask);
out({ call: "generate", text: generated.text, finish: generated.finishReason, steps: steps(generated.steps), executed: executed.splice(0) });

const errors = [];
const stream = streamText({ ...ask, onError: ({ error }) => { errors.push(String(error)); } });
let text = "", parts = 0;
for await (const part of stream.textStream) { text += part; parts += 1; }
out({ call: "stream", text, parts, finish: await stream.finishReason, steps: steps(await stream.steps), executed: executed.splice(0), errors });

const City = z.object({ name: z.string().min(1), country: z.string().min(1) });
const made = await generateObject({
  model, schema: City, schemaName: "City", temperature: 0, maxOutputTokens: 80, maxRetries: 0,
  headers: { "cf-aig-skip-cache": "true" }, prompt: "Name the capital city of France and its country.",
});
out({ call: "object", object: made.object, valid: City.safeParse(made.object).success, finish: made.finishReason });
