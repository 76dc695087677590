"""JSON Schema helpers: checking a schema once, validating instances against it, never raising;
and finding the JSON objects and arrays written in a text (:func:`json_values`).

A malformed schema is the request's fault, not the answer's: the server rejects it with a 400
(using :func:`check_schema`), and the scorer, if it ever sees one, skips that check.

The regexes of a schema (``pattern``, ``patternProperties``, and ``propertyNames`` through
``pattern``) come from the client and run on the model's answer, so they are matched with RE2
(``google-re2``), whose time is linear in the text, instead of Python's backtracking ``re``, on
which ``^(a|a)+$`` against ``"aaaa…!"`` never ends. ``bench/regex_timeout.py`` compared RE2 with the
``regex`` module's ``timeout=``: both match a typical schema pattern in 1-3 µs, but ``regex``
spells out counted repetitions when it compiles (``((a{100}){100}){100}``: 0.37 s and +260 MB,
with no timeout), and a per-match timeout adds up over the strings of an array. RE2 refuses
such patterns at once, and settles the ReDoS one correctly in 0.1 ms. It has no backreferences
or lookarounds.

A pattern RE2 cannot compile (unsupported syntax, or a program over :data:`RE2_MAX_MEM`), or a
text it cannot take (a lone surrogate), is a failed check, never a pass: the answer is not
trusted. ``additionalProperties`` next to
``patternProperties`` is checked with the same RE2 patterns. ``unevaluatedProperties`` in a
schema that also has ``patternProperties`` anywhere fails the check, since jsonschema would
match those patterns with ``re`` to find the evaluated keys.

A client's schema is checked once, on the request (:func:`check_schema`): first its size and
depth (:data:`MAX_SCHEMA_BYTES`, :data:`MAX_SCHEMA_DEPTH`), in one walk that stops at the first
limit, then against its draft's meta-schema with ``jsonschema-rs``. jsonschema's own Draft 2020-12
check took about 0.55 ms for each empty property (33 s for 60,000 of them); ``jsonschema-rs``
checks the same schema in 19 ms. The meta-schemas are compiled once, from jsonschema's copies,
with a retriever that refuses every fetch: a client's ``$schema`` or ``$ref`` never makes a
request. The ``regex`` format of ``pattern`` is checked there too (ECMA 262 syntax).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import lru_cache, partial
from typing import Any

import jsonschema
import jsonschema_rs
import re2
from jsonschema.exceptions import ValidationError
from jsonschema.protocols import Validator

RE2_MAX_MEM = 2 << 20
"""Bytes RE2 may use to compile one pattern (its default is 8 MiB); larger programs fail."""
MAX_CACHED_SCHEMA = 64 * 1024
"""Longest schema (as JSON) whose validator is cached: 256 keys of 16 MiB in all at most."""
PATTERN_CACHE = 32
"""Compiled patterns kept: at most ``PATTERN_CACHE * RE2_MAX_MEM`` bytes, a few KB in practice."""
MAX_SCHEMA_BYTES = 1 << 20
"""Largest schema a request may carry, as compact JSON (strings counted in characters)."""
MAX_SCHEMA_DEPTH = 64
"""Deepest nesting of objects and arrays in a schema (``properties`` then a property: two)."""


def _too_big(schema: Any) -> str | None:
    """Why ``schema`` passes a limit (its compact JSON size, its depth), or None; linear, bounded.

    The walk stops as soon as either limit is passed, so its cost is bounded by
    :data:`MAX_SCHEMA_BYTES` whatever the request holds.
    """
    size = 0
    stack: list[tuple[Any, int]] = [(schema, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            if depth > MAX_SCHEMA_DEPTH:
                return f"it nests deeper than {MAX_SCHEMA_DEPTH} levels"
            size += 2 + len(value)
            for key, item in value.items():
                size += len(key) + 3
                stack.append((item, depth + 1))
        elif isinstance(value, list):
            if depth > MAX_SCHEMA_DEPTH:
                return f"it nests deeper than {MAX_SCHEMA_DEPTH} levels"
            size += 2 + len(value)
            stack.extend((item, depth + 1) for item in value)
        elif isinstance(value, str):
            size += len(value) + 2
        else:  # a number, true, false or null; json.loads bounds an integer's digits
            size += len(repr(value)) if isinstance(value, int | float) else 5
        if size > MAX_SCHEMA_BYTES:
            return f"it is larger than {MAX_SCHEMA_BYTES} bytes of JSON"
    return None


def _no_fetch(uri: str) -> Any:
    raise ValueError(f"remote references are not fetched ({uri[:80]!r})")


@lru_cache(maxsize=8)
def _meta_check(cls: type[Any]) -> Any:
    """A compiled check of ``cls``'s meta-schema (one per draft; compiled in about 3 ms)."""
    return jsonschema_rs.validator_for(cls.META_SCHEMA, validate_formats=True, retriever=_no_fetch)


def check_schema(schema: Any) -> str | None:
    """An error message if ``schema`` is not a valid JSON Schema within the limits, else None.

    The draft is the one its ``$schema`` names, as jsonschema picks it (the latest, 2020-12, for
    none or an unknown one).
    """
    if not isinstance(schema, dict | bool):
        return f"a JSON Schema must be an object or a boolean, not {type(schema).__name__}"
    if isinstance(schema, dict) and not isinstance(schema.get("$schema", ""), str):
        return "invalid JSON Schema at $schema: it must be a string"
    problem = _too_big(schema)
    if problem is not None:
        return f"the schema is too large: {problem}"
    try:
        check = _meta_check(jsonschema.validators.validator_for(schema))
        error = next(iter(check.iter_errors(schema)), None)
    except UnicodeEncodeError:
        return "invalid JSON Schema: it holds a lone surrogate (\\ud800 to \\udfff): not UTF-8"
    except Exception as exc:  # noqa: BLE001 - a schema must never crash the caller
        return f"invalid JSON Schema: {str(exc).splitlines()[0][:200]}"
    if error is None:
        return None
    where = "/".join(str(p) for p in error.instance_path)
    return f"invalid JSON Schema{' at ' + where if where else ''}: {error.message[:300]}"


class _BadPattern(Exception):
    """RE2 cannot compile a client's pattern."""


@lru_cache(maxsize=PATTERN_CACHE)
def _compiled(pattern: str) -> Any:
    options = re2.Options()
    options.log_errors = False
    options.max_mem = RE2_MAX_MEM
    try:
        return re2.compile(pattern, options)
    except (re2.error, ValueError):  # RE2's own errors; a lone surrogate that is not UTF-8
        return None


def search(pattern: str, text: str) -> bool:
    """``re.search(pattern, text)`` in linear time; raises _BadPattern if RE2 can't match it."""
    compiled = _compiled(pattern)
    if compiled is None:
        raise _BadPattern(pattern)
    try:
        return compiled.search(text) is not None
    except ValueError as exc:  # text RE2 cannot take (not encodable as UTF-8)
        raise _BadPattern(pattern) from exc


def _unusable(pattern: Any) -> ValidationError:
    return ValidationError(f"the pattern {str(pattern)[:80]!r} cannot be matched safely")


def _pattern(validator: Any, pattern: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "string"):
        return
    try:
        if not search(pattern, instance):
            yield ValidationError(f"{instance[:80]!r} does not match {pattern[:80]!r}")
    except _BadPattern:
        yield _unusable(pattern)


def _pattern_properties(
    validator: Any, patterns: Any, instance: Any, schema: Any
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            try:
                matched = search(pattern, key)
            except _BadPattern:
                yield _unusable(pattern)
                return
            if matched:
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional_properties(
    validator: Any, additional: Any, instance: Any, schema: Any, *, plain: Any
) -> Iterator[ValidationError]:
    patterns = schema.get("patternProperties")
    if not patterns or not validator.is_type(instance, "object"):
        yield from plain(validator, additional, instance, schema)  # no regex involved
        return
    properties = schema.get("properties", {})
    extras = []
    for key in instance:
        if key in properties:
            continue
        try:
            if not any(search(p, key) for p in patterns):
                extras.append(key)
        except _BadPattern as exc:
            yield _unusable(exc.args[0])
            return
    if validator.is_type(additional, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], additional, path=extra)
    elif not additional and extras:
        yield ValidationError(f"{len(extras)} properties match none of the patterns")


def _refuse_unevaluated(
    validator: Any, unevaluated: Any, instance: Any, schema: Any
) -> Iterator[ValidationError]:
    yield ValidationError("unevaluatedProperties next to patternProperties is not checked")


@lru_cache(maxsize=16)
def _safe_class(base: type[Any], refuse_unevaluated: bool) -> Any:
    """``base`` with its regex keywords matched by RE2."""
    keywords: dict[str, Any] = {
        "pattern": _pattern,
        "patternProperties": _pattern_properties,
        "additionalProperties": partial(
            _additional_properties, plain=base.VALIDATORS["additionalProperties"]
        ),
    }
    if refuse_unevaluated:
        keywords["unevaluatedProperties"] = _refuse_unevaluated
    return jsonschema.validators.extend(base, keywords)


@lru_cache(maxsize=256)
def _validator(schema_json: str) -> Validator | None:
    schema = json.loads(schema_json)
    if check_schema(schema) is not None:
        return None
    base = jsonschema.validators.validator_for(schema)
    # jsonschema finds the keys ``unevaluatedProperties`` may skip with ``re`` on the patterns
    # (the text test may also catch a property so named: that only makes the check stricter).
    refuse = '"patternProperties"' in schema_json and '"unevaluatedProperties"' in schema_json
    validator: Validator = _safe_class(base, refuse)(schema)
    return validator


def validate(instance: Any, schema: Any) -> bool | None:
    """True if ``instance`` fits ``schema``, False if not, None if the schema can't be used."""
    try:
        text = json.dumps(schema, sort_keys=True)
        # The cache keeps its keys and schemas: a big schema is compiled afresh, not kept.
        validator = (
            _validator(text) if len(text) <= MAX_CACHED_SCHEMA else _validator.__wrapped__(text)
        )
    except (TypeError, ValueError):
        return None
    if validator is None:
        return None
    try:
        return bool(validator.is_valid(instance))
    except Exception:  # noqa: BLE001 - unresolvable $ref, …
        return None


def json_values(text: str, *, starts_within: int | None = None) -> Iterator[Any]:
    """Every JSON object or array written in ``text``, bare, fenced or inside prose, in order
    of where it starts (only the first ``starts_within`` characters are looked at for a start,
    when given). One that does not parse, or nests past Python's recursion limit, is skipped."""
    decoder = json.JSONDecoder()
    for i, ch in enumerate(text[:starts_within]):
        if ch in "[{":
            try:
                value, _ = decoder.raw_decode(text, i)
            except (ValueError, RecursionError):
                continue
            if isinstance(value, dict | list):
                yield value
