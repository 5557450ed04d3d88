"""The binding's published input schema, as data: inputs are checked the way Workers AI checks
them, never with the gateway's own validation (which would make the two unable to disagree)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import jsonschema

from edgellm.ports import InvalidModelInput

INPUT_SCHEMA_PATH = Path(__file__).with_name("schemas") / "text-generation.input.json"


@dataclass(frozen=True)
class InputSchema:
    """A Workers AI model's input JSON schema: refuses what the binding refuses (error 5006) and
    fills in the defaults it publishes (temperature 0.6, max_tokens 256, ...)."""

    schema: dict[str, Any]

    @classmethod
    def load(cls, path: Path = INPUT_SCHEMA_PATH) -> "InputSchema":
        schema = json.loads(path.read_text())
        jsonschema.Draft202012Validator.check_schema(schema)
        return cls(schema)

    def check(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(self.schema).iter_errors(dict(inputs)))
        if error is not None:
            where = "/" + "/".join(str(p) for p in error.absolute_path)
            raise InvalidModelInput(f"5006: Input validation error: {where}: {error.message}")
        defaults = {k: v["default"] for k, v in self.schema["properties"].items() if "default" in v}
        return {**defaults, **{k: v for k, v in inputs.items() if v is not None}}
