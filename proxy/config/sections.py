"""The settings' shape: one frozen, keyword-only dataclass per TOML section, and their defaults.

    Settings        every section, the ``[pricing]`` tables and where they came from
    SECTIONS        section name -> its dataclass, in the order of ``config.example.toml``
    ServerSettings, LocalSettings (with its BackendSettings), FallbackSettings, RouterSettings,
    QualitySettings, LedgerSettings, CacheSettings, ResponsesSettings, CostSettings, ModelPrice
    (``[audit]`` is :class:`proxy.config.audit_settings.AuditSettings` and ``[batch]``
    :class:`proxy.config.batch_settings.BatchSettings`; each checks its own ranges)

Every field is documented in ``config.example.toml``; a test keeps the two in step. Nothing here
reads a file or checks a range: :mod:`proxy.config.load` builds these from TOML and
:mod:`proxy.config.checks` validates them.

Imports :mod:`proxy.config.audit_settings` and :mod:`proxy.config.batch_settings` (the
``[audit]`` and ``[batch]`` sections, pure modules) and nothing else of ``proxy``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from proxy.config.audit_settings import AuditSettings
from proxy.config.batch_settings import BatchSettings

SPECULATIVE_MODES = ("off", "prompt-lookup", "draft")
MEMORY_GUARDS = ("shrink", "refuse", "off")
STREAM_MODES = ("verify", "live")
RESPONSES_FALLBACKS = ("responses", "translate")
OBJECTIVES = ("cost", "latency")
# [[local.backends]] kind: what each does with a request is proxy.routing.remote_kinds's
BACKEND_KINDS = (
    "llama-server",
    "llama-cpp-python",
    "vllm",
    "ollama",
    "frugal",
    "openai-compatible",
)


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
    max_concurrency_per_key: int = 0  # 0: a quarter of max_concurrency, at least 1

    def key_concurrency(self, own: int | None = None) -> int:
        """The requests in flight one client key may hold: its own share (``frugal keys create
        --max-concurrency``) or ``max_concurrency_per_key`` (0: a quarter of ``max_concurrency``),
        never every slot: at most ``max_concurrency`` - 1, and at least 1."""
        share = own or self.max_concurrency_per_key or self.max_concurrency // 4
        return max(1, min(share, self.max_concurrency - 1))


@dataclass(frozen=True, kw_only=True)
class BackendSettings:
    """``[[local.backends]]``: another OpenAI-compatible inference server (``llama-server``,
    ``python -m llama_cpp.server``, vLLM, Ollama, another ``frugal serve``) that local answers
    may come from; ``kind`` says which (:data:`BACKEND_KINDS`)."""

    name: str
    api_base: str
    kind: str = "openai-compatible"
    api_key_env: str = ""
    model: str = "local"
    max_concurrency: int = 1
    max_queue: int = 16
    timeout_s: float = 0.0  # 0: [local] timeout_s
    prefill_tok_s: float = 0.0  # 0: unknown until measured
    decode_tok_s: float = 0.0
    logprobs: bool = True
    probe_timeout_s: float = 2.0
    max_answer_bytes: int = 8 * 1024 * 1024  # past it, an answer (or a stream) is a failure

    def api_key(self) -> str | None:
        """The backend's bearer key, read from the environment; None when there is none."""
        if not self.api_key_env:
            return None
        return os.environ.get(self.api_key_env) or None


@dataclass(frozen=True, kw_only=True)
class LocalSettings:
    model_path: str = ""
    model: str = ""  # "REPO:QUANT", found in the Hugging Face cache (proxy/models/)
    n_threads: int = 0
    n_ctx: int = 4096
    timeout_s: float = 30.0
    speculative: str = "prompt-lookup"  # the design's default; "off" turns it off
    draft_model_path: str = ""
    default_max_tokens: int = 512
    thinking_budget: int = 1024  # tokens a thinking model's answer may think for (reasoning.py)
    max_queue: int = 16
    max_deferred_queue: int = 1024  # deferred jobs allowed to wait (proxy/engine/priority.py)
    parallel: int = 4  # sequences decoded together in one llama.cpp context (batch/decode.py)
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
    flex_timeout_s: float = 900.0  # timeout_s for a call sent with service_tier "flex"
    max_retries: int = 2
    models: dict[str, str] = field(default_factory=dict)
    usage_wait_s: float = 5.0  # how long a stream whose client left is read on, for its usage
    responses: str = "responses"  # /v1/responses falls back to the API's own, or "translate"
    max_answer_bytes: int = 32 * 1024 * 1024  # an answer's body, or one event of a stream

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
    # A budget reservation's lease: renewed every third of it while its call runs; a crashed
    # replica's reservations are released within it (proxy/ledger/tenants/budgets.py).
    reservation_lease_s: float = 30.0


@dataclass(frozen=True, kw_only=True)
class CacheSettings:
    """``[cache]``: answers to deterministic requests (temperature 0 or a seed), kept in the
    ledger database (proxy/ledger/response_cache.py)."""

    enabled: bool = False
    ttl_s: float = 3600.0
    max_entries: int = 10_000
    shared: bool = False  # true: one client key may be answered from another key's entry


@dataclass(frozen=True, kw_only=True)
class ResponsesSettings:
    """``[responses]``: stored Responses (``store``, ``previous_response_id``), kept in the
    ledger database (proxy/ledger/responses_store.py)."""

    retention_days: float = 30.0  # older stored responses are deleted; 0: kept until deleted
    max_stored_bytes_per_key: int = 1024**3  # what one key keeps, in bytes of JSON (1 GiB)
    max_stored_per_key: int = 50_000  # how many responses one key keeps
    max_background_per_key: int = 64  # background responses one key has queued or running


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
    responses: ResponsesSettings = field(default_factory=ResponsesSettings)
    audit: AuditSettings = field(default_factory=AuditSettings)
    batch: BatchSettings = field(default_factory=BatchSettings)
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
    "responses": ResponsesSettings,
    "audit": AuditSettings,
    "batch": BatchSettings,
}
