"""Settings: TOML parsed once into frozen dataclasses, validated at load time.

    sections   the dataclasses, one per TOML section, with their defaults (``Settings``)
    load       the file found (--config, $FRUGAL_CONFIG, ./frugal.toml), parsed and built
    checks     the ranges and rules every loaded value is held to
    audit_settings  the ``[audit]`` section (``AuditSettings``)
    batch_settings  the ``[batch]`` section (``BatchSettings``): work that can wait
    model_name      ``[local] model``: a model file, or a Hugging Face model by name
    secrets         ``Secrets``: the secret values the settings and the environment name, and
                    the one function that clears a foreign body of them (``scrub``)

Every field is documented in ``config.example.toml``; a test keeps the two in step.
A bad value raises :class:`~proxy.errors.ConfigError` naming the key, the value and what was
expected.

``from proxy.config import Settings, load`` is the interface the rest of the proxy uses; the
modules above are where each part lives. Everything in ``proxy`` may import this room; it
imports :mod:`proxy.errors` only.
"""

from __future__ import annotations

from proxy.config.batch_settings import BatchSettings
from proxy.config.checks import validate
from proxy.config.load import from_dict, load, resolve_path
from proxy.config.sections import (
    BACKEND_KINDS,
    SECTIONS,
    BackendSettings,
    CacheSettings,
    CostSettings,
    FallbackSettings,
    LedgerSettings,
    LocalSettings,
    ModelPrice,
    QualitySettings,
    ResponsesSettings,
    RouterSettings,
    ServerSettings,
    Settings,
    default_threads,
)
from proxy.errors import ConfigError

__all__ = [
    "BACKEND_KINDS",
    "SECTIONS",
    "BackendSettings",
    "BatchSettings",
    "CacheSettings",
    "ConfigError",
    "CostSettings",
    "FallbackSettings",
    "LedgerSettings",
    "LocalSettings",
    "ModelPrice",
    "QualitySettings",
    "ResponsesSettings",
    "RouterSettings",
    "ServerSettings",
    "Settings",
    "default_threads",
    "from_dict",
    "load",
    "resolve_path",
    "validate",
]
