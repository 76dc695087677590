"""Settings: TOML parsed once into frozen dataclasses, validated at load time.

Every field here is documented in ``config.example.toml``; a test keeps the two in step.
A bad value raises :class:`ConfigError` naming the key, the value and what was expected.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from decimal import Decimal
from pathlib import Path
from typing import Any, get_args, get_type_hints

from proxy.audit.settings import AuditSettings
from proxy.errors import ConfigError

SPECULATIVE_MODES = ("off", "prompt-lookup", "draft")
MEMORY_GUARDS = ("shrink", "refuse", "off")
STREAM_MODES = ("verify", "live")
OBJECTIVES = ("cost", "latency")


def default_threads() -> int:
    """cores − 1, at least 1: leave one core for the proxy itself."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cores or 1) - 1)


@dataclass(frozen=True, kw_only=True)
class ServerSettings:
    host: str = "127.0.0.1"
    port: int = 8080
    drain_s: float = 20.0
    log_content: bool = False
    log_format: str = "auto"
    api_keys_env: str = "FRUGAL_API_KEYS"
    allow_public_without_keys: bool = False
    metrics_open: bool = False
    max_body_bytes: int = 8 * 1024 * 1024
    max_concurrency: int = 64
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    keep_alive_s: int = 30


@dataclass(frozen=True, kw_only=True)
class BackendSettings:
    """``[[local.backends]]``: another OpenAI-compatible llama.cpp server (``llama-server``, or
    another ``frugal serve``) that local answers may come from."""

    name: str
    api_base: str
    api_key_env: str = ""
    model: str = "local"
    max_concurrency: int = 1
    max_queue: int = 16
    timeout_s: float = 0.0  # 0: [local] timeout_s
    prefill_tok_s: float = 0.0  # 0: unknown until measured
    decode_tok_s: float = 0.0
    logprobs: bool = True
    probe_timeout_s: float = 2.0

    def api_key(self) -> str | None:
        """The backend's bearer key, read from the environment; None when there is none."""
        if not self.api_key_env:
            return None
        return os.environ.get(self.api_key_env) or None


@dataclass(frozen=True, kw_only=True)
class LocalSettings:
    model_path: str = ""
    n_threads: int = 0
    n_ctx: int = 4096
    timeout_s: float = 30.0
    speculative: str = "off"
    draft_model_path: str = ""
    default_max_tokens: int = 512
    max_queue: int = 16
    parallel: int = 1  # sequences decoded together in one llama.cpp context (batch.py)
    seed: int = 0
    draft_max_tokens: int = 8
    lookup_ngram: int = 3
    flash_attn: bool = True
    prefix_cache_mb: int = 256
    memory_guard: str = "shrink"
    backends: tuple[BackendSettings, ...] = ()  # [[local.backends]]

    @property
    def threads(self) -> int:
        return self.n_threads if self.n_threads > 0 else default_threads()


@dataclass(frozen=True, kw_only=True)
class FallbackSettings:
    api_base: str = "https://api.openai.com/v1"
    api_key_env: str = "OPENAI_API_KEY"
    timeout_s: float = 60.0
    connect_timeout_s: float = 5.0
    max_retries: int = 2
    models: dict[str, str] = field(default_factory=dict)

    def api_key(self) -> str | None:
        """The upstream key, read from the environment; None when it is not set."""
        if not self.api_key_env:
            return ""
        value = os.environ.get(self.api_key_env, "")
        return value or None

    @property
    def enabled(self) -> bool:
        """A fallback exists when an upstream is named and its key (if one is needed) is set."""
        return bool(self.api_base or self.models) and self.api_key() is not None


@dataclass(frozen=True, kw_only=True)
class RouterSettings:
    stream_mode: str = "verify"
    predictive: bool = True
    objective: str = "cost"
    latency_margin_s: float = 0.5
    prereject: bool = False  # skip a local attempt the pre-router predicts will be rejected


@dataclass(frozen=True, kw_only=True)
class QualitySettings:
    threshold: float = 0.6
    models: dict[str, float] = field(default_factory=dict)  # requested model -> its threshold
    relevance: bool = True  # the embedding-model signal, when its package is installed
    weights_path: str = ""  # "": the shipped weights; else a file made by `frugal calibrate`
    auto_calibrate: bool = False  # refit weights_path from the audits every 100 new audits
    target_precision: float = 0.0  # 0: off; else the threshold in force is picked from audits


@dataclass(frozen=True, kw_only=True)
class LedgerSettings:
    path: str = "frugal.db"
    url: str = ""  # sqlite:///PATH or postgresql://USER@HOST/DB; "" means the file at path
    password_env: str = ""  # the variable holding the PostgreSQL password (never the URL)
    flush_interval_s: float = 0.2
    batch_size: int = 256
    busy_timeout_s: float = 5.0
    max_queue: int = 100_000
    shutdown_timeout_s: float = 5.0


@dataclass(frozen=True, kw_only=True)
class CacheSettings:
    """``[cache]``: answers to deterministic requests (temperature 0 or a seed), kept in the
    ledger database (proxy/ledger/cache.py)."""

    enabled: bool = False
    ttl_s: float = 3600.0
    max_entries: int = 10_000
    shared: bool = False  # true: one client key may be answered from another key's entry


@dataclass(frozen=True, kw_only=True)
class CostSettings:
    monthly_fixed_usd: float = 0.0


@dataclass(frozen=True, kw_only=True)
class ModelPrice:
    """``[pricing."<model>"]``: the price of one model in USD per million tokens. It replaces
    litellm's price for that name (requested model or ``[fallback] models`` target)."""

    input_per_mtok: float
    output_per_mtok: float
    cached_input_per_mtok: float | None = None  # None: cached prompt tokens cost the input price


@dataclass(frozen=True, kw_only=True)
class Settings:
    server: ServerSettings = field(default_factory=ServerSettings)
    local: LocalSettings = field(default_factory=LocalSettings)
    fallback: FallbackSettings = field(default_factory=FallbackSettings)
    router: RouterSettings = field(default_factory=RouterSettings)
    quality: QualitySettings = field(default_factory=QualitySettings)
    ledger: LedgerSettings = field(default_factory=LedgerSettings)
    costs: CostSettings = field(default_factory=CostSettings)
    cache: CacheSettings = field(default_factory=CacheSettings)
    audit: AuditSettings = field(default_factory=AuditSettings)
    pricing: dict[str, ModelPrice] = field(default_factory=dict)
    source: str = "<defaults>"


SECTIONS: dict[str, type] = {
    "server": ServerSettings,
    "local": LocalSettings,
    "fallback": FallbackSettings,
    "router": RouterSettings,
    "quality": QualitySettings,
    "ledger": LedgerSettings,
    "costs": CostSettings,
    "cache": CacheSettings,
    "audit": AuditSettings,
}


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


def _check_range(where: str, value: float, low: float, high: float | None = None) -> None:
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise ConfigError(f"{where} = {value!r}: expected a value {bound}")


def validate(settings: Settings) -> Settings:
    s = settings
    _check_range("[server] port", s.server.port, 1, 65535)
    _check_range("[server] drain_s", s.server.drain_s, 0.0, 600.0)
    _check_range("[server] max_body_bytes", s.server.max_body_bytes, 1024)
    _check_range("[server] max_concurrency", s.server.max_concurrency, 1)
    _check_range("[server] header_timeout_s", s.server.header_timeout_s, 0.1, 600.0)
    _check_range("[server] body_timeout_s", s.server.body_timeout_s, 0.1, 3600.0)
    _check_range("[server] keep_alive_s", s.server.keep_alive_s, 1, 3600)
    if s.server.api_keys_env and not s.server.api_keys_env.replace("_", "").isalnum():
        raise ConfigError(
            f"[server] api_keys_env = {s.server.api_keys_env!r}: expected the name of an "
            'environment variable, e.g. "FRUGAL_API_KEYS" (the keys themselves go in the '
            "environment, never in this file)"
        )
    if s.server.log_format not in ("auto", "json", "console"):
        raise ConfigError(
            f'[server] log_format = {s.server.log_format!r}: expected "auto", "json" or "console"'
        )
    _check_range("[local] n_threads", s.local.n_threads, 0)
    _check_range("[local] n_ctx", s.local.n_ctx, 256)
    _check_range("[local] timeout_s", s.local.timeout_s, 0.1)
    _check_range("[local] default_max_tokens", s.local.default_max_tokens, 1)
    _check_range("[local] max_queue", s.local.max_queue, 1)
    _check_range("[local] parallel", s.local.parallel, 1, 16)
    if s.local.speculative not in SPECULATIVE_MODES:
        raise ConfigError(
            f"[local] speculative = {s.local.speculative!r}: expected one of "
            + ", ".join(f'"{m}"' for m in SPECULATIVE_MODES)
        )
    if s.local.speculative == "draft" and not s.local.draft_model_path:
        raise ConfigError('[local] speculative = "draft" needs [local] draft_model_path')
    _check_range("[local] draft_max_tokens", s.local.draft_max_tokens, 1, 32)
    _check_range("[local] lookup_ngram", s.local.lookup_ngram, 1, 8)
    _check_range("[local] prefix_cache_mb", s.local.prefix_cache_mb, 0)
    if s.local.memory_guard not in MEMORY_GUARDS:
        raise ConfigError(
            f"[local] memory_guard = {s.local.memory_guard!r}: expected one of "
            + ", ".join(f'"{m}"' for m in MEMORY_GUARDS)
        )
    _validate_backends(s.local.backends)
    _check_range("[fallback] timeout_s", s.fallback.timeout_s, 0.1)
    _check_range("[fallback] connect_timeout_s", s.fallback.connect_timeout_s, 0.1)
    _check_range("[fallback] max_retries", s.fallback.max_retries, 0, 10)
    if s.fallback.api_base and not s.fallback.api_base.startswith(("http://", "https://")):
        raise ConfigError(
            f"[fallback] api_base = {s.fallback.api_base!r}: expected an http:// or https:// URL"
        )
    if s.router.stream_mode not in STREAM_MODES:
        raise ConfigError(
            f'[router] stream_mode = {s.router.stream_mode!r}: expected "verify" or "live"'
        )
    if s.router.objective not in OBJECTIVES:
        raise ConfigError(
            f'[router] objective = {s.router.objective!r}: expected "cost" or "latency"'
        )
    _check_range("[router] latency_margin_s", s.router.latency_margin_s, 0.0, 600.0)
    _check_range("[quality] threshold", s.quality.threshold, 0.0, 1.0)
    if s.quality.target_precision != 0.0:
        _check_range("[quality] target_precision", s.quality.target_precision, 0.5, 0.999)
    for model, threshold in s.quality.models.items():
        _check_range(f'[quality.models] "{model}"', threshold, 0.0, 1.0)
    if s.quality.auto_calibrate and not s.quality.weights_path:
        raise ConfigError(
            "[quality] auto_calibrate = true: expected a weights_path, the file it writes"
        )
    if not s.ledger.path:
        raise ConfigError("[ledger] path: expected a file path, got an empty string")
    _check_ledger_url(s.ledger)
    _check_range("[ledger] flush_interval_s", s.ledger.flush_interval_s, 0.01, 10.0)
    _check_range("[ledger] batch_size", s.ledger.batch_size, 1)
    _check_range("[ledger] busy_timeout_s", s.ledger.busy_timeout_s, 0.01, 600.0)
    _check_range("[ledger] max_queue", s.ledger.max_queue, 1)
    _check_range("[ledger] shutdown_timeout_s", s.ledger.shutdown_timeout_s, 1.0, 120.0)
    _check_range("[cache] ttl_s", s.cache.ttl_s, 1.0, 365 * 86400.0)
    _check_range("[cache] max_entries", s.cache.max_entries, 1)
    _check_range("[costs] monthly_fixed_usd", s.costs.monthly_fixed_usd, 0.0)
    return settings


def _validate_backends(backends: tuple[BackendSettings, ...]) -> None:
    names = set()
    for b in backends:
        where = f'[[local.backends]] name = "{b.name}":'
        if b.name == "engine" or b.name in names:
            raise ConfigError(
                f'{where} expected a unique name other than "engine" (the bundled engine)'
            )
        names.add(b.name)
        if not b.api_base.startswith(("http://", "https://")):
            raise ConfigError(f"{where} api_base = {b.api_base!r}: expected an http(s) URL")
        _check_range(f"{where} max_concurrency", b.max_concurrency, 1, 256)
        _check_range(f"{where} max_queue", b.max_queue, 0)
        _check_range(f"{where} timeout_s", b.timeout_s, 0.0)
        _check_range(f"{where} prefill_tok_s", b.prefill_tok_s, 0.0)
        _check_range(f"{where} decode_tok_s", b.decode_tok_s, 0.0)
        _check_range(f"{where} probe_timeout_s", b.probe_timeout_s, 0.1, 60.0)


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


def from_dict(raw: dict[str, Any], source: str = "<dict>") -> Settings:
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


def _check_ledger_url(ledger: LedgerSettings) -> None:
    """``[ledger] url``: a known scheme, and never a password (that is ``password_env``'s)."""
    from urllib.parse import urlsplit

    if not ledger.url:
        return
    scheme = ledger.url.split("://", 1)[0].lower() if "://" in ledger.url else ""
    if scheme not in ("sqlite", "postgresql", "postgres"):
        raise ConfigError(
            "[ledger] url: expected sqlite:///PATH or postgresql://USER@HOST/DATABASE"
        )
    parts = urlsplit(ledger.url)
    if parts.password is not None or "password=" in parts.query.lower():
        raise ConfigError(
            "[ledger] url: holds a password; remove it from the URL and put it in an "
            "environment variable named by [ledger] password_env"
        )
    if ledger.password_env and not ledger.password_env.replace("_", "").isalnum():
        raise ConfigError(
            "[ledger] password_env: expected the name of an environment variable (letters, "
            "digits and _, e.g. FRUGAL_DB_PASSWORD), not the password itself (not shown here)"
        )
