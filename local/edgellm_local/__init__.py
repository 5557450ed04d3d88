"""The local edge: the Worker's core run in CPython with local bindings.

Workers AI is backed by llama.cpp (xllamacpp), KV by SQLite, R2 by files, static assets by
`public/`. Never part of the deploy bundle (it lives outside `src/`).
"""
