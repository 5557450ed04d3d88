/**
 * Server-sent events framing, incrementally: feed text as the network delivers it, get back the
 * `data` payload of every complete event. Events split across reads, CRLF line endings and
 * multi-line data fields are handled; comments and other fields are ignored.
 * (The same rules as the edge's own `edgellm.sse.SSEDecoder`.)
 */
export class SSEDecoder {
  #buffer = "";
  #data = [];

  /** @param {string} text decoded text (use a streaming TextDecoder so characters never split) */
  feed(text) {
    this.#buffer += text;
    const events = [];
    let newline;
    while ((newline = this.#buffer.search(/\r\n|\r|\n/)) >= 0) {
      const width = this.#buffer.startsWith("\r\n", newline) ? 2 : 1;
      if (width === 1 && this.#buffer[newline] === "\r" && newline === this.#buffer.length - 1) break; // maybe a CRLF split in two
      const line = this.#buffer.slice(0, newline);
      this.#buffer = this.#buffer.slice(newline + width);
      if (line === "") {
        if (this.#data.length) events.push(this.#data.join("\n"));
        this.#data = [];
      } else if (line.startsWith("data:")) {
        this.#data.push(line.slice(5).replace(/^ /, ""));
      }
    }
    return events;
  }

  /** The last event when the stream ended without its blank line. */
  flush() {
    const events = this.feed("\n\n");
    this.#buffer = "";
    return events;
  }
}
