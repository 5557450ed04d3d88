"""Workers AI on llama.cpp (xllamacpp): the runner, the binding, and the slot pool that keeps
conversations warm."""
