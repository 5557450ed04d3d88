/**
 * Turning token ids into coloured pieces.
 *
 * A piece shows what its token means as text (the tokenizer's own decoder, so byte-level "Ġ"
 * becomes a space and SentencePiece "▁" too), with whitespace made visible. A token that is only
 * part of a UTF-8 character (an emoji split in two) shows its bytes in hex instead.
 */

const WHITESPACE = { " ": "·", "\n": "↵", "\t": "⇥", "\r": "␍" };
const COLOURS = 7;

/** Visible form of a piece of text: whitespace as symbols, invisible characters as U+XXXX. */
export function visibleText(text) {
  let out = "";
  for (const ch of text) {
    if (ch in WHITESPACE) out += WHITESPACE[ch];
    else if (/[\p{Cc}\p{Cf}\p{Zl}\p{Zp}]/u.test(ch)) out += `U+${ch.codePointAt(0).toString(16).toUpperCase().padStart(4, "0")}`;
    else out += ch;
  }
  return out;
}

/** GPT-2's byte-level alphabet reversed: the character a byte-level BPE uses for each byte -> the byte. */
function byteLevelAlphabet() {
  const printable = [];
  for (let b = 33; b <= 126; b++) printable.push(b);
  for (let b = 161; b <= 172; b++) printable.push(b);
  for (let b = 174; b <= 255; b++) printable.push(b);
  const map = new Map(printable.map((b) => [String.fromCodePoint(b), b]));
  let next = 256;
  for (let b = 0; b < 256; b++) if (!printable.includes(b)) map.set(String.fromCodePoint(next++), b);
  return map;
}
const BYTE_LEVEL = byteLevelAlphabet();

/** A byte-level token's bytes as hex ("E4 BD"), or null when it is not byte-level text. */
export function byteLevelHex(token) {
  const bytes = [];
  for (const ch of token) {
    if (!BYTE_LEVEL.has(ch)) return null;
    bytes.push(BYTE_LEVEL.get(ch).toString(16).toUpperCase().padStart(2, "0"));
  }
  return bytes.join(" ");
}

/**
 * What a piece shows: the text its token stands for, whitespace made visible. A token holding only part of a UTF-8 character decodes to
 * U+FFFD; it shows its bytes instead ("<E4 BD>"), or its raw vocabulary entry when that is
 * already readable (SentencePiece's "<0xE4>").
 */
export function pieceLabel(tokenizer, id, token) {
  let text = "";
  try {
    text = tokenizer.decode([id], { skip_special_tokens: false, clean_up_tokenization_spaces: false });
  } catch {
    text = "";
  }
  if (text !== "" && !text.includes("\uFFFD")) return visibleText(text);
  const hex = token ? byteLevelHex(token) : null;
  return hex ? `<${hex}>` : token ?? text;
}

/**
 * Render `ids` into `container` as pieces (at most `limit`, since a DOM node per token stops
 * being useful long before the tokenizer slows down).
 * @returns {number} how many pieces were rendered
 */
export function renderPieces(container, tokenizer, encoding, specialIds, limit = 2000) {
  const fragment = document.createDocumentFragment();
  const count = Math.min(encoding.ids.length, limit);
  for (let i = 0; i < count; i++) {
    const id = encoding.ids[i];
    const raw = encoding.tokens[i];
    const piece = document.createElement("span");
    piece.className = `piece c${i % COLOURS}` + (specialIds.has(id) ? " special" : "");
    piece.dataset.id = String(id);
    piece.title = `id ${id} · ${JSON.stringify(raw)}`;
    const text = document.createElement("span");
    text.className = "text";
    text.textContent = pieceLabel(tokenizer, id, raw);
    const label = document.createElement("span");
    label.className = "id";
    label.textContent = String(id);
    piece.append(text, label);
    fragment.append(piece);
  }
  container.replaceChildren(fragment);
  return count;
}
