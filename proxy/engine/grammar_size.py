"""The size of a grammar before it is built: an upper bound, refused past the limits.

llama.cpp's schema converter spells out counted repetitions (``{n,m}`` in a ``pattern``,
``maxLength``, ``maxItems``) and copies rule names, which grow with the schema's nesting, into
every rule that uses them, so a 100-byte schema could ask it for gigabytes. Before the converter
sees a schema, :class:`Sizer` walks it the way the converter does (the same branches, and the
same quantifier parsing: ``int()`` of the text between braces, which also takes ``+``, ``_`` and
spaces) and adds up an upper bound of the grammar's characters, its rules, and the converter's
work on optional properties (quadratic in their number). That walk is linear in the schema and
stops at the first limit passed (:data:`MAX_GRAMMAR_CHARS`, :data:`MAX_RULES`,
:data:`MAX_OPTIONAL_STEPS`, and :data:`MAX_BOUND` on every repetition bound). It also refuses
pattern syntax on which the converter would loop forever (a lone ``}`` or ``]``).
:func:`refusal` says why a spec is refused, or None; :mod:`proxy.engine.grammar` builds the
grammars of the specs it lets through.
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = [
    "ANY_CHAR",
    "BOUNDS",
    "MAX_BOUND",
    "MAX_GRAMMAR_CHARS",
    "MAX_OPTIONAL_STEPS",
    "MAX_RULES",
    "NODE_CHARS",
    "PRIMITIVES_CHARS",
    "TEXT_RULE",
    "Refused",
    "Sizer",
    "call_schema",
    "check_bounds",
    "quantifier",
    "refusal",
]

ANY_CHAR = r"[\x00-\U0010FFFF]"
# A text answer (when a tool call is optional) may not begin with "{", which starts a call, nor
# with white space, so that "  {" cannot sneak an unconstrained object past the call grammar.
TEXT_RULE = r"[^{ \t\r\n] " + ANY_CHAR + "*"
# The converter spells out bounded repetitions, so a grammar grows with the bounds in a schema:
# larger ones (``"maxLength": 100000000`` would take gigabytes) go to the API instead.
MAX_BOUND = 512
MAX_GRAMMAR_CHARS = 256 * 1024
"""Most characters of grammar text a request may need (an upper bound, checked before building)."""
MAX_RULES = 640
"""Most grammar rules: the converter scans rules of one name linearly to add another."""
MAX_OPTIONAL_STEPS = 10_000
"""Most steps the converter may take over optional properties (m * (m + 1) / 2 for m of them)."""
NODE_CHARS = 48
"""Characters a rule costs besides its name: `` ::= ``, spaces, quotes, ``space`` tokens."""
PRIMITIVES_CHARS = 2048
"""All of the converter's built-in rules together (1,420 characters in llama-cpp-python 0.3)."""
BOUNDS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties")


class Refused(Exception):
    """The sizer refuses a spec: past a limit, or a shape the converter would fail on too."""


def check_bounds(node: Any, depth: int = 0) -> None:
    """Refuse schemas whose repetition bounds would make the grammar huge."""
    if depth > 64:
        raise Refused("the schema is nested too deeply")
    if isinstance(node, list):
        for item in node:
            check_bounds(item, depth + 1)
        return
    if not isinstance(node, dict):
        return
    for key, value in node.items():
        if key in BOUNDS and isinstance(value, int | float) and value > MAX_BOUND:
            raise Refused(f"{key} {value} is above {MAX_BOUND}")
        check_bounds(value, depth + 1)


def call_schema(calls: list[list[Any]]) -> dict[str, Any]:
    """The schema of a call to one of the tools: its name and its arguments."""
    options = [
        {
            "type": "object",
            "properties": {
                "name": {"const": name},
                "arguments": params if params else {"type": "object"},
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for name, params in calls
    ]
    return options[0] if len(options) == 1 else {"oneOf": options}


_ESCAPED = frozenset("[]()|{}*+?")
_NON_LITERAL = frozenset("|.()[]{}*+?")
_RULE_NAME_SUFFIX = 8
"""Characters the converter may add to a rule name: ``-12``, ``-kv``, a collision counter."""


def _count(value: Any) -> int:
    """A repetition bound as the converter would use it; 0 where using it raises first."""
    if isinstance(value, bool | int):
        return int(value)
    if isinstance(value, float) and math.isfinite(value):
        return int(value)
    return 0


def quantifier(text: str) -> tuple[int, int | None]:
    """``{text}`` parsed as the converter does: ``int()`` of each side of one comma."""
    nums = [s.strip() for s in text.split(",")]
    try:
        if len(nums) == 1:
            low = int(nums[0])
            return low, low
        if len(nums) == 2:
            return (int(nums[0]) if nums[0] else 0), (int(nums[1]) if nums[1] else None)
    except ValueError as exc:
        raise Refused("a pattern has an invalid quantifier") from exc
    raise Refused("a pattern has an invalid quantifier")


class Sizer:
    """An upper bound of what the converter will build for a spec, refused past the limits.

    Each method follows one branch of ``llama_cpp.llama_grammar.SchemaConverter`` (``visit``,
    ``_build_object_rule``, ``_visit_pattern``, ``_build_repetition``) and counts characters
    instead of writing them. Rule names are counted by length: a child's name is its parent's,
    a dash and its key, as the converter names them.
    """

    def __init__(self) -> None:
        self.chars = len('space ::= " "?')
        self.rules = 1  # the converter's "space" rule
        self.optional_steps = 0
        self.primitives = False
        self.refs: set[str] = set()
        self.root: Any = None

    def spend(self, chars: int, rules: int = 0) -> None:
        self.chars += chars
        self.rules += rules
        if self.chars > MAX_GRAMMAR_CHARS:
            raise Refused(f"the grammar would take more than {MAX_GRAMMAR_CHARS} characters")
        if self.rules > MAX_RULES:
            raise Refused(f"the grammar would take more than {MAX_RULES} rules")

    def rule(self, name: int, content: int) -> None:
        self.spend(name + content + NODE_CHARS, rules=1)

    def primitive(self) -> None:
        if not self.primitives:
            self.primitives = True
            self.spend(PRIMITIVES_CHARS, rules=16)

    def repetition(self, item: int, low: int, high: int | None, sep: int = 0) -> int:
        """Characters of ``_build_repetition(item, low, high, sep)``."""
        for bound in (low, high):
            if bound is not None and bound > MAX_BOUND:
                raise Refused(f"a schema repeats something more than {MAX_BOUND} times")
        size = max(low, 0) * (item + sep + 3) + item + sep + 8
        if high is not None:
            size += max(high - max(low, 0), 0) * (item + sep + 6)
        if size > MAX_GRAMMAR_CHARS:
            raise Refused(f"the grammar would take more than {MAX_GRAMMAR_CHARS} characters")
        return size

    def spec(self, data: dict[str, Any]) -> None:
        calls = data.get("calls")
        if calls:
            self.root = call_schema(calls)
            self.visit(self.root, len("call"))
            self.spend(NODE_CHARS + len(TEXT_RULE), rules=2)
            if int(data.get("most") or 1) > 1:  # calls ::= call ("\n" call){0,N}
                self.spend(NODE_CHARS + 32, rules=1)
        if data.get("json") is not None:
            self.refs = set()
            self.root = data["json"]
            self.visit(self.root, len("answer"))

    def target(self, ref: str) -> Any:
        """What a local ``$ref`` points to, as the converter resolves it (None if it can't)."""
        if not ref.startswith("#/"):
            return None
        node = self.root
        for part in ref.split("#")[-1].split("/")[1:]:
            if not isinstance(node, dict) or part not in node:
                return None
            node = node[part]
        return node

    def visit(self, schema: Any, name: int) -> None:  # noqa: PLR0912 - one branch per converter branch
        if not isinstance(schema, dict):
            return  # the converter fails on it
        name = max(name, 4) + 1
        self.rule(name, name + NODE_CHARS)
        kind = schema.get("type")
        ref = schema.get("$ref")
        if ref is not None:
            if isinstance(ref, str) and ref not in self.refs:
                self.refs.add(ref)
                found = self.target(ref)
                if found is None:  # another document, or a path to nothing: the converter fails
                    raise Refused("a $ref the grammar cannot resolve")
                self.visit(found, len(ref.split("/")[-1]))
        elif "oneOf" in schema or "anyOf" in schema:
            alternatives = schema.get("oneOf") or schema["anyOf"]
            for i, alternative in enumerate(alternatives if isinstance(alternatives, list) else ()):
                self.visit(alternative, name + len("alternative-") + len(str(i)))
        elif isinstance(kind, list):
            for _ in kind:
                self.primitive()
                self.rule(name + _RULE_NAME_SUFFIX, name + NODE_CHARS)
        elif "const" in schema:
            self.spend(2 * len(json.dumps(schema["const"])))
        elif "enum" in schema:
            values = schema["enum"]
            for value in values if isinstance(values, list | str | dict) else ():
                self.spend(2 * len(json.dumps(value)) + 8)
        elif kind in (None, "object") and (
            "properties" in schema
            or ("additionalProperties" in schema and schema["additionalProperties"] is not True)
        ):
            properties = schema.get("properties", {})
            items = list(properties.items()) if isinstance(properties, dict) else []
            required = schema.get("required", [])
            self.object(items, required, name, schema.get("additionalProperties"))
        elif kind in (None, "object") and "allOf" in schema:
            items = []
            for part in schema["allOf"] if isinstance(schema["allOf"], list) else ():
                components = part.get("anyOf") if isinstance(part, dict) else None
                for component in components if isinstance(components, list) else [part]:
                    if isinstance(component, dict) and isinstance(component.get("$ref"), str):
                        component = self.target(component["$ref"])
                    found = component.get("properties") if isinstance(component, dict) else None
                    if isinstance(found, dict):
                        items.extend(found.items())
            self.object(items, [], name, [])
        elif kind in (None, "array") and ("items" in schema or "prefixItems" in schema):
            items_schema = schema.get("items") or schema["prefixItems"]
            if isinstance(items_schema, list):
                for i, item in enumerate(items_schema):
                    self.visit(item, name + len("-tuple-") + len(str(i)))
                    self.spend(name + 24)
            else:
                item_name = name + len("-item") + _RULE_NAME_SUFFIX
                self.visit(items_schema, item_name)
                low, high = schema.get("minItems", 0), schema.get("maxItems")
                size = self.repetition(
                    item_name, _count(low), None if high is None else _count(high), sep=11
                )
                self.spend(size)
        elif kind in (None, "string") and "pattern" in schema:
            self.pattern(schema["pattern"], name)
        elif kind == "string" and ("minLength" in schema or "maxLength" in schema):
            self.primitive()
            low, high = schema.get("minLength", 0), schema.get("maxLength")
            self.spend(self.repetition(4, _count(low), None if high is None else _count(high)))
        else:
            self.primitive()

    def object(self, items: list[tuple[Any, Any]], required: Any, name: int, extra: Any) -> None:
        """``_build_object_rule``: each property's value, key-value and "rest" rules."""
        required_names = set(required) if isinstance(required, list) else set()
        optional = 0
        for key, value in items:
            child = name + len(str(key)) + _RULE_NAME_SUFFIX
            self.visit(value, child)
            key_text = 2 * len(json.dumps(key)) if isinstance(key, str) else 0
            self.rule(child, key_text + child + NODE_CHARS)  # the key-value rule
            self.spend(child + 8)  # its name in the object's rule
            if key not in required_names:
                optional += 1
                self.rule(child, 3 * child + NODE_CHARS)  # the "rest" rule, and two uses of it
        if extra is True or isinstance(extra, dict):
            child = name + len("-additional-value") + _RULE_NAME_SUFFIX
            self.primitive()
            self.visit({} if extra is True else extra, child)
            self.rule(child, 2 * child + NODE_CHARS)
            self.rule(child, 3 * child + NODE_CHARS)
            optional += 1
        self.optional_steps += optional * (optional + 1) // 2
        if self.optional_steps > MAX_OPTIONAL_STEPS:
            raise Refused("the schemas have too many optional properties")

    def pattern(self, pattern: Any, name: int) -> None:
        """``_visit_pattern``: the regex translated unit by unit, its repetitions spelt out."""
        if not isinstance(pattern, str) or not (pattern.startswith("^") and pattern.endswith("$")):
            return  # the converter refuses it
        try:
            size = _PatternSizer(self, pattern[1:-1], name).top()
        except RecursionError as exc:
            raise Refused("a pattern is nested too deeply") from exc
        self.rule(name, size + 20)


class _PatternSizer:
    """Sizes of the converter's pattern units: (characters, whether it is a plain literal)."""

    def __init__(self, sizer: Sizer, body: str, name: int) -> None:
        self.sizer = sizer
        self.body = body
        self.name = name
        self.i = 0

    def top(self) -> int:
        size, literal = self.unit()
        return size + 2 * literal

    def unit(self) -> tuple[int, bool]:  # noqa: PLR0912 - one branch per converter branch
        body, n = self.body, len(self.body)
        start = self.i
        seq: list[tuple[int, bool]] = []
        while self.i < n:
            c = body[self.i]
            if c == ".":
                self.sizer.primitive()
                seq.append((3, False))
                self.i += 1
            elif c == "(":
                self.i += 1
                if self.i < n and body[self.i] == "?":
                    raise Refused("a pattern uses (?...) syntax")
                size, literal = self.unit()
                seq.append((size + 2 * literal + 2, False))
            elif c == ")":
                self.i += 1
                if not (start > 0 and body[start - 1] == "("):
                    raise Refused("a pattern has unbalanced parentheses")
                return self.join(seq)
            elif c == "[":
                j = self.i + 1
                while j < n and body[j] != "]":
                    j += 2 if body[j] == "\\" else 1
                if j >= n:
                    raise Refused("a pattern has unbalanced square brackets")
                seq.append((j - self.i + 1, False))
                self.i = j + 1
            elif c == "|":
                seq.append((1, False))
                self.i += 1
            elif c in "*+?":
                if not seq:
                    raise Refused(f"a pattern has nothing to repeat before {c}")
                size, literal = seq[-1]
                seq[-1] = (size + 2 * literal + 1, False)
                self.i += 1
            elif c == "{":
                j = body.find("}", self.i + 1)
                if j < 0:
                    raise Refused("a pattern has unbalanced curly brackets")
                low, high = quantifier(body[self.i + 1 : j])
                self.i = j + 1
                if not seq:
                    raise Refused("a pattern has nothing to repeat")
                size, literal = seq[-1]
                if literal:
                    item = size + 2
                else:  # the converter makes the unit a rule of its own and repeats its name
                    item = self.name + _RULE_NAME_SUFFIX
                    self.sizer.rule(item, size)
                seq[-1] = (self.sizer.repetition(item, low, high), False)
            else:
                size = self.literal()
                if size == 0:  # the converter would loop here for ever
                    raise Refused(f"a pattern has an unexpected {c!r}")
                seq.append((size, True))
        return self.join(seq)

    def literal(self) -> int:
        """Characters of the literal run at ``i``, read as the converter reads it."""
        body, n = self.body, len(self.body)
        size = 0
        while self.i < n:
            c = body[self.i]
            if c == "\\" and self.i < n - 1:
                if body[self.i + 1] in _ESCAPED:
                    size += 1
                else:
                    size += 2
                self.i += 2
            elif c == '"':
                size += 2
                self.i += 1
            elif c not in _NON_LITERAL and (
                self.i == n - 1
                or size == 0
                or body[self.i + 1] == "."
                or body[self.i + 1] not in _NON_LITERAL
            ):
                size += 1
                self.i += 1
            else:
                break
        return size

    @staticmethod
    def join(seq: list[tuple[int, bool]]) -> tuple[int, bool]:
        groups = sum(1 for k, unit in enumerate(seq) if not (unit[1] and k and seq[k - 1][1]))
        if groups == 1 and seq[0][1]:
            return sum(size for size, _ in seq), True
        if len(seq) == 1:
            return seq[0]
        return sum(size + 2 * literal for size, literal in seq) + max(len(seq) - 1, 0), False


def refusal(data: Any) -> str | None:
    """Why the grammar of ``spec`` data would pass the limits, or None; linear, no converter."""
    try:
        check_bounds(data)
        Sizer().spec(data)
    except Refused as exc:
        return str(exc)
    except Exception as exc:  # a shape the converter would fail on as well: refused, not guessed
        return f"{type(exc).__name__} while sizing the grammar"
    return None
