/**
 * One streamed chat completion from the edge: `fetch` + a stream reader over the OpenAI SSE
 * format, reporting as it goes (so the page renders each token when it arrives).
 *
 * Errors come back as the API worded them: a non-200 answer carries `{"error": {"message"}}`, and
 * a failure after the stream started arrives as an SSE `data: {"error": {...}}` event (the status
 * line was already sent), which ends the stream without `[DONE]`.
 */
import { ApiError, errorFrom } from "./api-errors.mjs";
import { SSEDecoder } from "./sse.mjs";

/**
 * @typedef {object} StreamCallbacks
 * @property {(info: {model: string|null, cacheStatus: string|null, age: string|null}) => void} [onOpen]
 * @property {(text: string) => void} [onDelta]
 * @property {(model: string) => void} [onModel]
 * @property {(reason: string) => void} [onFinish]
 * @property {(usage: {prompt_tokens: number, completion_tokens: number}) => void} [onUsage]
 */

/**
 * POST `body` (with `stream: true` and usage requested) and feed the callbacks until `[DONE]`.
 * Rejects with ApiError (the API's message) or the fetch's AbortError when `signal` aborts.
 * @param {object} body an OpenAI chat request
 * @param {AbortSignal} signal
 * @param {StreamCallbacks} on
 * @param {Record<string, string>} [headers] extra request headers (a session: `x-session-affinity`)
 */
export async function streamChat(body, signal, on = {}, headers = {}) {
  const response = await fetch("/v1/chat/completions", {
    method: "POST",
    headers: { "content-type": "application/json", accept: "text/event-stream", ...headers },
    body: JSON.stringify({ ...body, stream: true, stream_options: { include_usage: true } }),
    signal,
  });
  if (!response.ok) throw await errorFrom(response);
  on.onOpen?.({
    model: response.headers.get("x-edgellm-model"),
    cacheStatus: response.headers.get("cf-aig-cache-status"),
    age: response.headers.get("age"),
  });
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  const decoder = new SSEDecoder();
  let model = null;
  try {
    for (;;) {
      const { value, done } = await reader.read();
      const payloads = done ? decoder.flush() : decoder.feed(value);
      for (const data of payloads) {
        if (data === "[DONE]") return;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new ApiError(chunk.error.message || "The stream failed.", response.status);
        if (chunk.model && chunk.model !== model) on.onModel?.((model = chunk.model));
        const choice = chunk.choices && chunk.choices[0];
        if (choice?.delta?.content) on.onDelta?.(choice.delta.content);
        if (choice?.finish_reason) on.onFinish?.(choice.finish_reason);
        if (chunk.usage) on.onUsage?.(chunk.usage);
      }
      if (done) throw new ApiError("The stream ended before the answer was complete.", response.status);
    }
  } finally {
    reader.cancel().catch(() => {}); // stop reading at [DONE] or an error event; a no-op when done
  }
}
