"""JSON Schema helpers: checking a schema once, validating instances against it, never raising.

A malformed schema is the request's fault, not the answer's: the server rejects it with a 400
(using :func:`check_schema`), and the scorer, if it ever sees one, skips that check.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

import jsonschema
from jsonschema.exceptions import SchemaError
from jsonschema.protocols import Validator


def check_schema(schema: Any) -> str | None:
    """An error message if ``schema`` is not a valid JSON Schema, else None."""
    if not isinstance(schema, dict | bool):
        return f"a JSON Schema must be an object or a boolean, not {type(schema).__name__}"
    try:
        cls = jsonschema.validators.validator_for(schema)
        cls.check_schema(schema)
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.path)
        return f"invalid JSON Schema{' at ' + where if where else ''}: {exc.message}"
    except Exception as exc:  # noqa: BLE001 - a schema must never crash the caller
        return f"invalid JSON Schema: {exc}"
    return None


@lru_cache(maxsize=256)
def _validator(schema_json: str) -> Validator | None:
    schema = json.loads(schema_json)
    if check_schema(schema) is not None:
        return None
    cls = jsonschema.validators.validator_for(schema)
    validator: Validator = cls(schema)
    return validator


def validate(instance: Any, schema: Any) -> bool | None:
    """True if ``instance`` fits ``schema``, False if not, None if the schema can't be used."""
    try:
        validator = _validator(json.dumps(schema, sort_keys=True))
    except (TypeError, ValueError):
        return None
    if validator is None:
        return None
    try:
        return bool(validator.is_valid(instance))
    except Exception:  # noqa: BLE001 - unresolvable $ref, bad regex inside the schema, …
        return None
