// The Vercel AI SDK's default provider, used as its docs show (`openai(model)`: the Responses
// API), against an edge: plain, streamed, and a turn continued with previousResponseId.
// usage: node vercel_ai_sdk.mjs <sdk prefix dir> <edge base URL> <model>; prints one JSON line per call.
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const [sdkDir, baseURL, modelId] = process.argv.slice(2);
const load = (pkg) => import(pathToFileURL(join(sdkDir, "node_modules", pkg, "dist", "index.js")).href);
const { createOpenAI } = await load("@ai-sdk/openai");
const { generateText, streamText } = await load("ai");

const openai = createOpenAI({ baseURL: `${baseURL}/v1`, apiKey: "unused-locally" });
const model = openai(modelId);
const headers = { "cf-aig-skip-cache": "true" };
const out = (o) => console.log(JSON.stringify(o));

const first = await generateText({ model, prompt: "Tell me about rivers and lakes.", maxOutputTokens: 6, temperature: 0, headers, maxRetries: 0 });
out({ call: "generate", text: first.text, finish: first.finishReason, id: first.response.id, usage: first.usage.raw });

const stream = streamText({ model, prompt: "Tell me about rivers and lakes.", maxOutputTokens: 6, temperature: 0, headers, maxRetries: 0,
  onError: ({ error }) => { out({ call: "stream-error", error: String(error) }); } });
let text = "", parts = 0;
for await (const part of stream.textStream) { text += part; parts += 1; }
out({ call: "stream", text, parts, finish: await stream.finishReason, usage: (await stream.usage).raw });

const next = await generateText({ model, prompt: "And the sea?", maxOutputTokens: 6, temperature: 0, headers, maxRetries: 0,
  providerOptions: { openai: { previousResponseId: first.response.id } } });
out({ call: "continue", text: next.text, usage: next.usage.raw });
