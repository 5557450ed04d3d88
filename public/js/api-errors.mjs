/**
 * Errors as the API words them. Every edge error is OpenAI's shape, `{"error": {"message", "type",
 * "param", "code"}}`, and the message is written for people, so the pages show it as it is.
 */

/** An error carrying the API's own message (`{"error": {"message": ...}}`) when it sent one. */
export class ApiError extends Error {
  constructor(message, status) {
    super(message);
    this.name = "ApiError";
    this.status = status;
  }
}

/** The API's message from a non-2xx response, or its status line when the body is not the API's. */
export async function errorFrom(response) {
  let message = `${response.status} ${response.statusText}`.trim();
  try {
    const body = await response.json();
    if (body && body.error && body.error.message) message = body.error.message;
  } catch { /* not JSON: keep the status line */ }
  return new ApiError(message, response.status);
}
