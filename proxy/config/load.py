"""Reading the settings: the config file found, its TOML parsed once and built into the frozen
dataclasses of :mod:`proxy.config.sections`, then validated (:mod:`proxy.config.checks`).

    resolve_path(flag)   --config, then $FRUGAL_CONFIG, then ./frugal.toml; None for defaults
    load(flag)           the file's Settings (or the defaults), validated
    from_dict(raw)       Settings from a parsed TOML document, validated

Each value is coerced to its field's type; an unknown section or key, a value of the wrong type
or a missing required key raises :class:`~proxy.errors.ConfigError` naming the key, the value and
what was expected.

Imports only the other modules of :mod:`proxy.config` and :mod:`proxy.errors`.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Iterable
from dataclasses import fields
from decimal import Decimal
from pathlib import Path
from typing import Any, get_args, get_type_hints

from proxy.config.checks import validate
from proxy.config.sections import SECTIONS, BackendSettings, ModelPrice, Settings
from proxy.errors import ConfigError


def from_dict(raw: dict[str, Any], source: str = "<dict>") -> Settings:
    """Settings from a parsed TOML document (``source`` names it in errors), validated."""
    unknown = sorted(set(raw) - set(SECTIONS) - {"pricing"})
    if unknown:
        raise ConfigError(
            f"[{unknown[0]}]: unknown section; known sections are "
            f"{', '.join([*SECTIONS, 'pricing'])}"
        )
    parts = {name: _build_section(name, cls, raw.get(name, {})) for name, cls in SECTIONS.items()}
    pricing = _build_pricing(raw.get("pricing", {}))
    return validate(Settings(**parts, pricing=pricing, source=source))


def resolve_path(explicit: str | None) -> Path | None:
    """--config, then $FRUGAL_CONFIG, then ./frugal.toml; None means built-in defaults."""
    if explicit:
        return Path(explicit)
    env = os.environ.get("FRUGAL_CONFIG")
    if env:
        return Path(env)
    local = Path("frugal.toml")
    return local if local.is_file() else None


def load(explicit: str | None = None) -> Settings:
    """The settings of the file :func:`resolve_path` finds, or the defaults, validated."""
    path = resolve_path(explicit)
    if path is None:
        return validate(Settings())
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ConfigError(f"config file not found: {path}") from exc
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from exc
    return from_dict(raw, source=str(path))


def _coerce(section: str, key: str, value: Any, default: Any, hint: Any = None) -> Any:
    """``value`` as the type of ``default``; ``hint`` is the field's type, for tables."""
    where = f"[{section}] {key}"
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{where} = {value!r}: expected true or false")
    if isinstance(default, int):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{where} = {value!r}: expected an integer")
    if isinstance(default, float):
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(f"{where} = {value!r}: expected a number")
    if isinstance(default, str):
        if isinstance(value, str):
            return value
        raise ConfigError(f"{where} = {value!r}: expected a string")
    if isinstance(default, tuple):
        return _build_backends(value)
    if isinstance(default, dict):
        return _coerce_table(section, key, value, get_args(hint)[1])
    raise ConfigError(f"{where}: unsupported setting")  # pragma: no cover


def _coerce_table(section: str, key: str, value: Any, item: type) -> dict[str, Any]:
    """A ``[section.key]`` table of name = value, each value coerced like a setting of type
    ``item``: ``[fallback.models]`` maps names to strings, ``[quality.models]`` to numbers."""
    if not isinstance(value, dict):
        raise ConfigError(
            f"[{section}] {key} = {value!r}: expected a table, e.g. [{section}.{key}]"
        )
    return {str(k): _coerce(f"{section}.{key}", f'"{k}"', v, item()) for k, v in value.items()}


def _build_backends(raw: Any) -> tuple[BackendSettings, ...]:
    """``[[local.backends]]`` tables: name and api_base required, every other key optional."""
    example = '[[local.backends]] name = "gpu", api_base = "http://10.0.0.2:8080/v1"'
    if not isinstance(raw, list):
        raise ConfigError(f"[local] backends = {raw!r}: expected [[local.backends]] tables")
    defaults = {f.name: f.default for f in fields(BackendSettings)}
    backends: list[BackendSettings] = []
    for i, entry in enumerate(raw):
        where = f"[[local.backends]] #{i + 1}"
        if not isinstance(entry, dict):
            raise ConfigError(f"{where} = {entry!r}: expected a table, e.g. {example}")
        _reject_unknown(where, entry, defaults)
        for key in ("name", "api_base"):
            if not isinstance(entry.get(key), str) or not entry[key]:
                raise ConfigError(f"{where} {key}: missing; expected a string, e.g. {example}")
        values = {
            k: v if k in ("name", "api_base") else _coerce("local.backends", k, v, defaults[k])
            for k, v in entry.items()
        }
        backends.append(BackendSettings(**values))
    return tuple(backends)


def _reject_unknown(where: str, table: dict[str, Any], known: Iterable[str]) -> None:
    """A clear error for the first key of ``table`` that is not in ``known`` (listed in order)."""
    names = list(known)
    unknown = sorted(set(table) - set(names))
    if unknown:
        raise ConfigError(f"{where} {unknown[0]}: unknown key; known keys are {', '.join(names)}")


def _build_section(name: str, cls: type, raw: Any) -> Any:
    if not isinstance(raw, dict):
        raise ConfigError(f"[{name}] must be a table, got {raw!r}")
    defaults = cls()
    _reject_unknown(f"[{name}]", raw, sorted(f.name for f in fields(cls)))
    hints = get_type_hints(cls)
    values = {k: _coerce(name, k, v, getattr(defaults, k), hints[k]) for k, v in raw.items()}
    return cls(**values)


def _build_pricing(raw: Any) -> dict[str, ModelPrice]:
    """``[pricing."<model>"]`` tables: input and output required, cached input optional, in USD
    per million tokens, exact to a pico-dollar per token (six decimals)."""
    example = '[pricing."gpt-4o-mini"] input_per_mtok = 0.15, output_per_mtok = 0.6'
    if not isinstance(raw, dict):
        raise ConfigError(f"[pricing] = {raw!r}: expected one table per model, e.g. {example}")
    known = [f.name for f in fields(ModelPrice)]
    prices = {}
    for model, entry in raw.items():
        where = f'[pricing."{model}"]'
        if not isinstance(entry, dict):
            raise ConfigError(f"{where} = {entry!r}: expected a table, e.g. {example}")
        _reject_unknown(where, entry, known)
        for key in known:
            if key not in entry:
                if key == "cached_input_per_mtok":
                    continue
                raise ConfigError(f"{where} {key}: missing; expected USD per million tokens")
            value = entry[key]
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ConfigError(
                    f"{where} {key} = {value!r}: expected a number of USD per million tokens, "
                    "at least 0"
                )
            per_token_pico = Decimal(str(value)) * 10**6
            if per_token_pico != per_token_pico.to_integral_value():
                raise ConfigError(
                    f"{where} {key} = {value!r}: more precise than the ledger can count (one "
                    "pico-dollar per token, i.e. six decimals of USD per million tokens)"
                )
        prices[model] = ModelPrice(**{k: float(v) for k, v in entry.items()})
    return prices
