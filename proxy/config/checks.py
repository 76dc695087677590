"""The settings' ranges and rules, checked once when they are loaded.

    validate(settings)   the same settings, or :class:`~proxy.errors.ConfigError` for the first
                         value out of its range (naming the key, the value and what was
                         expected); ``[[local.backends]]`` and ``[ledger] url`` have their own
                         rules (unique names, http(s) URLs, no password in a URL)

Imports only :mod:`proxy.config.sections`, :mod:`proxy.config.model_name` and
:mod:`proxy.errors`.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from proxy.config.model_name import ModelName
from proxy.config.sections import (
    BACKEND_KINDS,
    MEMORY_GUARDS,
    OBJECTIVES,
    RESPONSES_FALLBACKS,
    SPECULATIVE_MODES,
    STREAM_MODES,
    BackendSettings,
    LedgerSettings,
    LocalSettings,
    Settings,
)
from proxy.errors import ConfigError


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
    if s.server.max_concurrency_per_key and not (
        1 <= s.server.max_concurrency_per_key < max(2, s.server.max_concurrency)
    ):
        raise ConfigError(
            f"[server] max_concurrency_per_key = {s.server.max_concurrency_per_key!r}: expected 0 "
            f"(a quarter of max_concurrency) or 1 to {max(1, s.server.max_concurrency - 1)}, "
            f"below max_concurrency = {s.server.max_concurrency}, so that one key never holds "
            "every slot"
        )
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
    _check_range("[local] thinking_budget", s.local.thinking_budget, 1)
    _check_range("[local] max_queue", s.local.max_queue, 1)
    _check_range("[local] max_deferred_queue", s.local.max_deferred_queue, 1)
    _check_range("[local] parallel", s.local.parallel, 1, 16)
    if s.local.speculative not in SPECULATIVE_MODES:
        raise ConfigError(
            f"[local] speculative = {s.local.speculative!r}: expected one of "
            + ", ".join(f'"{m}"' for m in SPECULATIVE_MODES)
        )
    _check_model(s.local)
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
    _check_range("[fallback] flex_timeout_s", s.fallback.flex_timeout_s, 0.1, 86400.0)
    _check_range("[fallback] max_retries", s.fallback.max_retries, 0, 10)
    _check_range("[fallback] usage_wait_s", s.fallback.usage_wait_s, 0.0, 60.0)
    _check_range("[fallback] max_answer_bytes", s.fallback.max_answer_bytes, 1024, 1 << 30)
    if s.fallback.api_base and not s.fallback.api_base.startswith(("http://", "https://")):
        raise ConfigError(
            f"[fallback] api_base = {s.fallback.api_base!r}: expected an http:// or https:// URL"
        )
    if s.fallback.responses not in RESPONSES_FALLBACKS:
        raise ConfigError(
            f'[fallback] responses = {s.fallback.responses!r}: expected "responses" or "translate"'
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
    _check_range("[ledger] reservation_lease_s", s.ledger.reservation_lease_s, 1.0, 3600.0)
    _check_range("[cache] ttl_s", s.cache.ttl_s, 1.0, 365 * 86400.0)
    _check_range("[cache] max_entries", s.cache.max_entries, 1)
    _check_range("[responses] retention_days", s.responses.retention_days, 0.0, 36500.0)
    _check_range("[responses] max_stored_bytes_per_key", s.responses.max_stored_bytes_per_key, 1024)
    _check_range("[responses] max_stored_per_key", s.responses.max_stored_per_key, 1)
    _check_range(
        "[responses] max_background_per_key", s.responses.max_background_per_key, 1, 100_000
    )
    _check_range("[costs] monthly_fixed_usd", s.costs.monthly_fixed_usd, 0.0)
    return settings


def _check_model(local: LocalSettings) -> None:
    """``[local] model`` and ``model_path`` are two ways to name one model: one at most."""
    if not local.model:
        return
    if local.model_path:
        raise ConfigError(
            f"[local] model = {local.model!r} and [local] model_path = {local.model_path!r} are "
            "both set: they name the same thing, keep one"
        )
    try:
        ModelName.parse(local.model)
    except ValueError as exc:
        raise ConfigError(f"[local] model = {exc}") from exc


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
        if b.kind not in BACKEND_KINDS:
            raise ConfigError(
                f"{where} kind = {b.kind!r}: expected one of " + ", ".join(BACKEND_KINDS)
            )
        if b.kind == "llama-cpp-python" and b.max_concurrency != 1:
            raise ConfigError(
                f"{where} max_concurrency = {b.max_concurrency}: expected 1 for kind "
                '"llama-cpp-python" (one model lock: a second request cuts a running stream)'
            )
        _check_range(f"{where} max_concurrency", b.max_concurrency, 1, 256)
        _check_range(f"{where} max_queue", b.max_queue, 0)
        _check_range(f"{where} timeout_s", b.timeout_s, 0.0)
        _check_range(f"{where} prefill_tok_s", b.prefill_tok_s, 0.0)
        _check_range(f"{where} decode_tok_s", b.decode_tok_s, 0.0)
        _check_range(f"{where} probe_timeout_s", b.probe_timeout_s, 0.1, 60.0)
        _check_range(f"{where} max_answer_bytes", b.max_answer_bytes, 1024, 1 << 30)


def _check_ledger_url(ledger: LedgerSettings) -> None:
    """``[ledger] url``: a known scheme, and never a password (that is ``password_env``'s)."""
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
