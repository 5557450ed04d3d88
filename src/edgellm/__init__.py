"""EdgeLLM core: plain async Python shared by the Cloudflare Worker and the local edge.

Nothing in this package imports `workers`, `js`, `pyodide`, `sqlite3` or `socket`; the
runtime adapters in `edgellm.runtime` (and the local edge outside `src/`) hand it its bindings.
"""

__version__ = "0.1.0"
