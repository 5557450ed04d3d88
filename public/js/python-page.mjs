/**
 * Python in the browser, from the edge alone: Pyodide (vendored from npm into /vendor/pyodide/)
 * boots with its files from this site, installs the pure-Python wheels this site serves
 * (/vendor/wheels/index.json lists them), and runs the editable example, which talks to the edge
 * with `requests` patched by `pyodide-http` (the browser's XMLHttpRequest underneath).
 */
import { loadPyodide } from "../vendor/pyodide/pyodide.mjs";
import { errorFrom } from "./api-errors.mjs";

const EXAMPLE = `import pyodide_http
pyodide_http.patch_all()  # requests now goes through the browser's own HTTP
import requests

# EDGE is this site, MODEL the first model published on it
tokenizer = requests.get(f"{EDGE}/models/{MODEL}/tokenizer.json").json()
config = requests.get(f"{EDGE}/models/{MODEL}/config.json").json()
print(f"{MODEL}: {len(tokenizer['model']['vocab']):,} tokens in the vocabulary,",
      f"{config.get('num_hidden_layers')} layers, architecture {config.get('architectures')}")

question = "What is the capital of France?"
reply = requests.post(f"{EDGE}/v1/chat/completions", json={
    "messages": [
        {"role": "system", "content": "You are a helpful assistant. Answer in one sentence."},
        {"role": "user", "content": question},
    ],
    "max_tokens": 32,
    "temperature": 0,
})
reply.raise_for_status()
print("Q:", question)
print("A:", reply.json()["choices"][0]["message"]["content"])
print("cache:", reply.headers.get("cf-aig-cache-status"))
`;

// https://fetch.spec.whatwg.org/#forbidden-request-header (lower case, as pyodide-http compares)
const FORBIDDEN_HEADERS = ["accept-charset", "accept-encoding", "access-control-request-headers",
  "access-control-request-method", "connection", "content-length", "cookie", "cookie2", "date", "dnt", "expect",
  "host", "keep-alive", "origin", "referer", "set-cookie", "te", "trailer", "transfer-encoding", "upgrade",
  "user-agent", "via"];

const ui = {
  status: document.getElementById("status"),
  error: document.getElementById("error"),
  code: document.getElementById("code"),
  run: document.getElementById("run"),
  reset: document.getElementById("reset"),
  output: document.getElementById("output"),
};

function write(text, stream) {
  const line = document.createElement("span");
  if (stream === "stderr") line.className = "stderr";
  line.textContent = text + "\n";
  ui.output.append(line);
}

async function publishedModel() {
  const response = await fetch("/models");
  if (!response.ok) throw await errorFrom(response);
  const { data } = await response.json();
  return data.length ? data[0].name : null;
}

async function boot() {
  const started = performance.now();
  const pyodide = await loadPyodide({ indexURL: new URL("../vendor/pyodide/", import.meta.url).href });
  pyodide.setStdout({ batched: (text) => write(text, "stdout") });
  pyodide.setStderr({ batched: (text) => write(text, "stderr") });
  const wheels = await (await fetch("/vendor/wheels/index.json")).json();
  await pyodide.loadPackage(wheels.map((name) => new URL(`/vendor/wheels/${name}`, location.href).href), {
    messageCallback: () => {}, errorCallback: (message) => write(message, "stderr"),
  });
  // pyodide-http hands every header requests made to XMLHttpRequest, which refuses the ones only
  // the browser may set (Accept-Encoding, Connection, Content-Length, ...) with a console error
  // each: leave those to the browser, as the Fetch standard's forbidden header names say.
  pyodide.runPython(`import pyodide_http._core as _core
_core.HEADERS_TO_IGNORE = tuple(set(_core.HEADERS_TO_IGNORE) | {${FORBIDDEN_HEADERS.map((h) => JSON.stringify(h)).join(", ")}})
del _core`);
  const model = await publishedModel();
  pyodide.globals.set("EDGE", location.origin);
  pyodide.globals.set("MODEL", model);
  const seconds = ((performance.now() - started) / 1000).toFixed(1);
  ui.status.textContent = model
    ? `Python ${pyodide.version} is ready (${seconds} s); ${wheels.length} wheels installed from this edge.`
    : `Python is ready, but no model is published on this edge yet: run \`edgellm publish\`.`;
  return pyodide;
}

async function run(pyodide) {
  ui.run.disabled = true;
  ui.output.textContent = "";
  ui.error.textContent = "";
  ui.status.textContent = "Running…";
  const started = performance.now();
  try {
    await pyodide.runPythonAsync(ui.code.value);
    ui.status.textContent = `Ran in ${((performance.now() - started) / 1000).toFixed(2)} s.`;
    ui.output.dataset.runs = String(Number(ui.output.dataset.runs || 0) + 1);
  } catch (error) {
    write(String(error.message || error), "stderr");
    ui.status.textContent = "The code raised an exception (shown below).";
  } finally {
    ui.run.disabled = false;
  }
}

async function main() {
  ui.code.value = EXAMPLE;
  let pyodide;
  try {
    pyodide = await boot();
  } catch (error) {
    ui.status.textContent = "";
    ui.error.textContent = `Python could not start: ${error.message}`;
    return;
  }
  ui.code.disabled = ui.run.disabled = ui.reset.disabled = false;
  ui.run.addEventListener("click", () => run(pyodide));
  ui.reset.addEventListener("click", () => { ui.code.value = EXAMPLE; });
  ui.code.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) { event.preventDefault(); run(pyodide); }
  });
  document.body.dataset.ready = "true";
  await run(pyodide);
}

main();
