"""The secrets this process holds, and the one way a foreign body is cleared of them.

An upstream API, a gateway in front of it, or a remote backend may echo what it was sent,
``Authorization`` header included, in an error message ("Incorrect API key provided: Bearer
sk-..."). Whatever the proxy relays from them (a 4xx body, a stream's events, an answer) would
then hand the provider's key to the tenant who sent the request, or write it to the log and the
ledger. :class:`Secrets` holds the values the proxy knows to be secret, and
:meth:`Secrets.scrub` replaces each of them with :data:`MARK`:

- the key named by ``[fallback] api_key_env`` and each ``[[local.backends]]`` ``api_key_env``;
- the client keys of ``[server] api_keys_env`` (``name:key`` entries or bare keys);
- the PostgreSQL password of ``[ledger] password_env``;
- the value of every environment variable whose name marks it as a secret
  (:data:`SECRET_MARKERS`: ``ANTHROPIC_API_KEY``, ``HF_TOKEN``...), which is where litellm's
  providers read their own keys;
- and, per request, the caller's own bearer token (:meth:`Secrets.plus`).

It matches known values, not the look of a key: each value in its plain form, ``Bearer
<value>``, URL-encoded (``%2B``, ``%2F``, ``+`` for a space) and JSON-escaped (``\\/``,
``\\u00e9``...). A value shorter than :data:`MIN_SECRET_CHARS` is not scrubbed: replacing a
4-character value everywhere would mangle answers, and no real key is that short. Error bodies
and error events are also cleared of anything shaped like an OpenAI or a frugal key
(:data:`KEY_SHAPE`), known or not (:meth:`Secrets.scrub_error`); answers are not, where the
shape could be a model's own text.

Everything here is pure (a frozen set of byte strings); the environment is read once, by
:meth:`Secrets.known`, when the app starts.
"""

from __future__ import annotations

import json
import os
import re
import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import re2

from proxy.config.sections import Settings

__all__ = [
    "KEY_SHAPE",
    "MARK",
    "FEW",
    "MIN_SECRET_CHARS",
    "NO_SECRETS",
    "SECRET_MARKERS",
    "Secrets",
    "is_secret_name",
]

MARK = "[redacted]"
"""What each occurrence of a secret becomes."""
MIN_SECRET_CHARS = 8
"""Values shorter than this are not scrubbed (see the module docstring)."""
SECRET_MARKERS = (
    "API_KEY",
    "APIKEY",
    "TOKEN",
    "SECRET",
    "PASSWORD",
    "PASSWD",
    "CREDENTIAL",
    "PRIVATE",
    "AUTH",
)
"""Parts of an environment variable's name that mark its value as a secret."""
KEY_SHAPE = re.compile(rb"(?:Bearer\s+)?\b(?:sk|frugal)-[A-Za-z0-9_\-]{16,}")
"""An OpenAI-style (``sk-...``) or frugal client key (``frugal-...``), with its ``Bearer``."""
_MARK = MARK.encode()
_PERCENT = re.compile(r"%[0-9A-F]{2}")
_UNCHANGED = re.compile(r"[A-Za-z0-9_.~-]+")  # what neither URL-encoding nor JSON escapes
FEW = 4
"""Up to this many secret values, a body is searched for each with ``in``; past it, for all of
them in one RE2 pass, whose cost does not grow with their number."""


def is_secret_name(name: str) -> bool:
    """Whether an environment variable's name says it holds a secret."""
    upper = name.upper()
    return any(marker in upper for marker in SECRET_MARKERS)


def _forms(value: str) -> list[str]:
    """``value`` as it may appear in a body: in a ``Bearer`` header, URL-encoded, JSON-escaped."""
    forms = {value}
    for quoted in (
        urllib.parse.quote(value, safe=""),
        urllib.parse.quote(value),
        urllib.parse.quote_plus(value),
    ):
        forms.add(quoted)
        forms.add(_PERCENT.sub(lambda m: m.group().lower(), quoted))  # %2f as well as %2F
    for escaped in (json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1]):
        forms.add(escaped)
        forms.add(escaped.replace("/", "\\/"))
    forms |= {f"Bearer {form}" for form in list(forms)}
    return sorted(forms, key=len, reverse=True)  # "Bearer <key>" goes whole, before the key


def _spaced(value: str) -> bool:
    """Whether a value has white space in it: a setting of a secret-named variable (a list, a
    sentence), not a key."""
    return any(c.isspace() for c in value)


def _env_client_keys(value: str) -> list[str]:
    """The keys of a ``[server] api_keys_env`` value: ``name:key`` (the name may carry
    ``;options``) or a bare key, comma-separated (:mod:`proxy.ledger.tenants.keys` parses it)."""
    keys = []
    for entry in value.split(","):
        name, sep, key = entry.strip().partition(":")
        keys.append((key if sep else name).strip())
    return keys


def _core(value: str) -> bytes:
    """The longest run of ``value`` that no form changes (letters, digits, ``_.~-``): every
    form of ``value`` holds it as it is."""
    return max(_UNCHANGED.findall(value), key=len, default="").encode()


@dataclass(frozen=True, slots=True)
class Secrets:
    """The secret values the proxy knows, and their forms to look for (longest first).

    Every answer and stream event is looked at, so the look is cheap: a body is searched for
    each value's :func:`_core` alone (by ``in`` for a few values, in one RE2 pass for more,
    :data:`FEW`), and only a body that holds one is searched for every form and rewritten.
    """

    values: frozenset[str] = frozenset()
    needles: tuple[bytes, ...] = ()
    cores: tuple[bytes, ...] = ()
    finder: Any = None  # an RE2 pattern of the cores, when there are more than FEW

    @classmethod
    def of(cls, values: Iterable[str | None]) -> Secrets:
        """These values (None, empty and short ones left out)."""
        kept = frozenset(v for v in values if v and len(v) >= MIN_SECRET_CHARS)
        forms = {form.encode() for value in kept for form in _forms(value)}
        cores = tuple(sorted({_core(value) for value in kept}))
        finder = None
        if len(cores) > FEW:
            finder = re2.compile(b"|".join(re.escape(core) for core in cores))
        return cls(kept, tuple(sorted(forms, key=len, reverse=True)), cores, finder)

    @classmethod
    def known(cls, settings: Settings, environ: Mapping[str, str] | None = None) -> Secrets:
        """Every secret ``settings`` names, and every secret-named variable of ``environ``
        (the process's environment by default), read now."""
        env = os.environ if environ is None else environ
        values: list[str | None] = [env.get(settings.fallback.api_key_env or "")]
        values += [env.get(b.api_key_env) for b in settings.local.backends if b.api_key_env]
        if settings.ledger.password_env:
            values.append(env.get(settings.ledger.password_env))
        if settings.server.api_keys_env:
            values += _env_client_keys(env.get(settings.server.api_keys_env, ""))
        values += [v for name, v in env.items() if is_secret_name(name) and not _spaced(v)]
        return cls.of(values)

    def plus(self, *values: str | None) -> Secrets:
        """These secrets and ``values`` (a caller's own bearer token)."""
        extra = {v for v in values if v and len(v) >= MIN_SECRET_CHARS} - self.values
        return self if not extra else Secrets.of([*self.values, *extra])

    def __bool__(self) -> bool:
        return bool(self.values)

    def scrub(self, data: bytes) -> bytes:
        """``data`` with every form of every secret replaced by :data:`MARK` (``data`` itself,
        not a copy, when it holds none)."""
        if self.finder is not None:
            if self.finder.search(data) is None:
                return data
        else:
            for core in self.cores:
                if core in data:
                    break
            else:
                return data
        for needle in self.needles:
            if needle in data:
                data = data.replace(needle, _MARK)
        return data

    def scrub_text(self, text: str) -> str:
        """:meth:`scrub` for text."""
        if not self.needles:
            return text
        data = text.encode("utf-8", "surrogatepass")
        scrubbed = self.scrub(data)
        return text if scrubbed is data else scrubbed.decode("utf-8", "surrogatepass")

    def scrub_error(self, data: bytes) -> bytes:
        """An error body or event: :meth:`scrub`, then anything shaped like a key
        (:data:`KEY_SHAPE`), known or not."""
        return KEY_SHAPE.sub(_MARK, self.scrub(data))

    def scrub_tree(self, value: Any) -> Any:
        """Parsed JSON with every string in it (keys too) scrubbed as :meth:`scrub_error` does:
        what the escapes of its text hid (``\\u0073k-...``) is plain once parsed."""
        if isinstance(value, str):
            return self.scrub_error(value.encode("utf-8", "surrogatepass")).decode(
                "utf-8", "surrogatepass"
            )
        if isinstance(value, dict):
            return {self.scrub_tree(k): self.scrub_tree(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.scrub_tree(v) for v in value]
        return value


NO_SECRETS = Secrets()
"""No value known (a client built without the app's secrets); error bodies are still cleared of
key-shaped text."""
