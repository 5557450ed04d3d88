"""transformers.js in Chromium loads a published tokenizer from the edge with its default
`remotePathTemplate` (`{model}/resolve/{revision}/`): only `env.remoteHost` points at the edge, the
model id is the Hugging Face repo id `models/{name}`, and the ids equal Python `tokenizers`'.

transformers.js is not one of the site's pages, so it is not vendored into `public/`: `make
setup-test` unpacks its self-contained bundle from npm, and this test hands it to the page from
the edge's own origin (Playwright answers that one URL), so no request leaves the edge."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import pytest
from playwright.async_api import Page, Request

from edgellm_local.emulator.server import EdgeServer

from .conftest import BROWSER_LOOP, PUBLISHED_NAME, TINY_NAME
from .publishing import TokenizerFiles

pytestmark = BROWSER_LOOP
ROOT = Path(__file__).resolve().parents[2]
VERSION = "4.3.1"  # the Makefile's TRANSFORMERS_JS
BUNDLE = ROOT / "node_modules" / ".transformers-js" / VERSION / "transformers.min.js"
TEXTS = ["Hello, world! Tokenizers split text into pieces: 1234, café, 你好, 🙂.", "  leading spaces\tand tabs\nnew lines"]

LOAD = """async ([repo, texts]) => {
  const { AutoTokenizer, env } = await import("/test-vendor/transformers.min.js");
  env.remoteHost = location.origin + "/";   // the default remotePathTemplate is kept
  env.allowLocalModels = false;
  env.useBrowserCache = false;
  const tokenizer = await AutoTokenizer.from_pretrained(repo);
  return { template: env.remotePathTemplate, ids: texts.map((t) => tokenizer.encode(t, { add_special_tokens: false })) };
}"""


@pytest.mark.parametrize("name", [PUBLISHED_NAME, TINY_NAME])
async def test_transformers_js_loads_the_tokenizer_from_the_edge_with_the_default_template(
    page: Page, artifact_edge: EdgeServer, smollm2_files: TokenizerFiles, tiny_files: TokenizerFiles, name: str
) -> None:
    assert BUNDLE.exists(), f"{BUNDLE} is missing: `make setup-test` unpacks transformers.js {VERSION}"
    requests: list[Request] = []
    page.on("request", lambda request: requests.append(request))
    await page.route("**/test-vendor/transformers.min.js",
               lambda route: route.fulfill(path=str(BUNDLE), content_type="text/javascript"))
    await page.goto(artifact_edge.url + "/")

    got = await page.evaluate(LOAD, [f"models/{name}", TEXTS])

    assert got["template"] == "{model}/resolve/{revision}/"
    reference = (smollm2_files if name == PUBLISHED_NAME else tiny_files).tokenizer()
    assert got["ids"] == [reference.encode(t, add_special_tokens=False).ids for t in TEXTS]
    paths = {urlsplit(r.url).path for r in requests}
    assert f"/models/{name}/resolve/main/tokenizer.json" in paths and f"/models/{name}/resolve/main/tokenizer_config.json" in paths
    assert {urlsplit(r.url).netloc for r in requests} == {urlsplit(artifact_edge.url).netloc}
