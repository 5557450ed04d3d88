/**
 * The tokenizer page: pick a published model, fetch its tokenizer files from the edge, build the
 * tokenizer in the browser and tokenize the text box on every keystroke.
 *
 * The chosen model lives in the URL (`?model=name`) so a reload loads the same files again and
 * shows whether the browser revalidated them (304) instead of downloading them.
 */
import { Tokenizer } from "../vendor/tokenizers.min.mjs";
import { describeDelivery, fetchJsonArtifact, listPublishedModels } from "./artifacts.mjs";
import { renderPieces } from "./pieces.mjs";

const $ = (id) => document.getElementById(id);
const ui = {
  model: $("model"), reload: $("reload"), text: $("text"), status: $("status"), error: $("error"),
  vocab: $("vocab-size"), count: $("token-count"), chars: $("char-count"), loadTime: $("load-time"),
  fetchTokenizer: $("fetch-tokenizer"), fetchConfig: $("fetch-config"),
  pieces: $("pieces"), note: $("pieces-note"), ids: $("ids"),
};

/** The loaded tokenizer; replaced as a whole when another model loads. */
const state = { tokenizer: null, specialIds: new Set(), loading: 0 };

function showError(message) {
  ui.error.textContent = message;
}

function showDelivery(element, artifact) {
  const [headline, detail] = artifact ? describeDelivery(artifact.delivery, artifact.etag) : ["not published", "defaults used"];
  const small = document.createElement("small");
  small.className = "detail";
  small.textContent = detail;
  element.replaceChildren(headline, small);
  element.dataset.delivery = artifact ? artifact.delivery.kind : "missing";
}

function tokenize() {
  const { tokenizer } = state;
  if (!tokenizer) return;
  const text = ui.text.value;
  const encoding = tokenizer.encode(text, { add_special_tokens: false });
  const shown = renderPieces(ui.pieces, tokenizer, encoding, state.specialIds);
  ui.count.textContent = encoding.ids.length.toLocaleString("en");
  ui.chars.textContent = [...text].length.toLocaleString("en");
  ui.ids.textContent = JSON.stringify(encoding.ids);
  ui.note.textContent = shown < encoding.ids.length ? `Showing the first ${shown} of ${encoding.ids.length} tokens.` : "";
  ui.pieces.dataset.text = text.length.toString();
}

async function loadModel(name) {
  const ticket = ++state.loading; // a newer choice wins over a slower earlier one
  showError("");
  ui.status.textContent = `Loading ${name}…`;
  document.body.dataset.state = "loading";
  const base = `/models/${encodeURIComponent(name)}/`;
  try {
    const started = performance.now();
    const [tok, cfg] = await Promise.all([
      fetchJsonArtifact(base + "tokenizer.json"),
      fetchJsonArtifact(base + "tokenizer_config.json", { optional: true }),
    ]);
    const tokenizer = new Tokenizer(tok.data, cfg ? cfg.data : {});
    const elapsed = performance.now() - started;
    if (ticket !== state.loading) return;
    state.tokenizer = tokenizer;
    state.specialIds = new Set([...tokenizer.get_added_tokens_decoder()].filter(([, t]) => t.special).map(([id]) => id));
    ui.vocab.textContent = tokenizer.get_vocab(true).size.toLocaleString("en");
    ui.loadTime.textContent = `${elapsed.toFixed(0)} ms`;
    showDelivery(ui.fetchTokenizer, tok);
    showDelivery(ui.fetchConfig, cfg);
    ui.text.disabled = false;
    tokenize();
    ui.status.textContent = `${name} loaded in ${elapsed.toFixed(0)} ms.`;
    document.body.dataset.state = "ready";
  } catch (error) {
    if (ticket !== state.loading) return;
    showError(`Could not load the tokenizer of ${name}: ${error.message}`);
    ui.status.textContent = "";
    document.body.dataset.state = "error";
  }
}

function chosenModel() {
  return new URL(location.href).searchParams.get("model");
}

function choose(name) {
  const url = new URL(location.href);
  url.searchParams.set("model", name);
  history.replaceState(null, "", url);
  loadModel(name);
}

async function start() {
  ui.text.addEventListener("input", tokenize);
  ui.model.addEventListener("change", () => choose(ui.model.value));
  ui.reload.addEventListener("click", () => ui.model.value && loadModel(ui.model.value));
  let models = [];
  try {
    models = await listPublishedModels();
  } catch (error) {
    showError(`Could not list the published models: ${error.message}`);
  }
  const wanted = chosenModel();
  const names = models.map((m) => m.name);
  if (wanted && !names.includes(wanted)) names.unshift(wanted);
  if (!names.length) {
    ui.model.replaceChildren(new Option("No models published", ""));
    ui.status.textContent = "No models are published yet: run `edgellm publish MODEL.gguf --name NAME`.";
    document.body.dataset.state = "empty";
    return;
  }
  ui.model.replaceChildren(...names.map((name) => new Option(name, name)));
  ui.model.disabled = false;
  ui.model.value = wanted || names[0];
  loadModel(ui.model.value);
}

start();
