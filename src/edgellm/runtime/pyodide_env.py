"""The Worker's `env` as the core reads it: optional bindings (absent, `None` or `jsnull` alike)
and `[vars]`/secrets as a mapping for `Config.from_env`."""

from __future__ import annotations

from typing import Any, Mapping

from .pyodide_toolbox import is_missing


def optional_binding(env: Any, name: str) -> Any:
    binding = getattr(env, name, None)
    return None if binding is None or is_missing(binding) else binding


class EnvMapping(Mapping[str, Any]):
    """`[vars]` and secrets read as a mapping (they are attributes of `env`)."""

    def __init__(self, env: Any) -> None:
        self._env = env

    def __getitem__(self, name: str) -> Any:
        value = getattr(self._env, name, None)
        if value is None or is_missing(value):
            raise KeyError(name)
        return value

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(())

    def __len__(self) -> int:
        return 0
