"""The settings' shape (proxy/config/sections.py): the defaults, and config.example.toml
documenting every field with those defaults."""

from __future__ import annotations

import re
import tomllib
from dataclasses import fields
from pathlib import Path

import pytest

from proxy import config

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "config.example.toml"


def test_example_config_documents_every_field_with_a_comment() -> None:
    text = EXAMPLE.read_text()
    raw = tomllib.loads(text)
    for section, cls in config.SECTIONS.items():
        assert section in raw, f"[{section}] missing from config.example.toml"
        for f in fields(cls):
            if f.name == "models":
                assert re.search(rf"^\[{section}\.models\]", text, re.M), section
                continue
            assert f.name in raw[section], f"[{section}] {f.name} missing from the example"
            # A comment must sit right above the key, or above the group of keys it is in.
            block = text.split(f"[{section}]", 1)[1]
            above = block.split(f"\n{f.name} =", 1)[0].rstrip().splitlines()
            while above and re.match(r"^[a-z_]+ = ", above[-1]):
                above.pop()
            assert above and above[-1].lstrip().startswith("#"), (
                f"[{section}] {f.name} has no comment above it"
            )


def test_example_config_values_are_the_defaults() -> None:
    loaded = config.load(str(EXAMPLE))
    defaults = config.Settings()
    for section in config.SECTIONS:
        assert getattr(loaded, section) == getattr(defaults, section), section


def test_defaults_match_the_design() -> None:
    s = config.Settings()
    assert (s.server.host, s.server.port) == ("127.0.0.1", 8080)
    assert s.local.n_ctx == 4096
    assert s.quality.threshold == 0.6
    assert s.quality.models == {}
    assert s.local.threads >= 1
    assert s.local.threads == max(1, config.default_threads())
    assert s.local.speculative == "prompt-lookup"  # issue 27: the design's speculation, on
    assert s.local.parallel == 4


def test_fallback_is_enabled_only_when_its_key_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert not config.FallbackSettings().enabled
    monkeypatch.setenv("OPENAI_API_KEY", "sk-x")
    assert config.FallbackSettings().enabled
    assert config.FallbackSettings(api_base="http://127.0.0.1:1/v1", api_key_env="").enabled
    assert not config.FallbackSettings(api_base="", api_key_env="").enabled


def test_example_config_documents_every_backend_key() -> None:
    # [[local.backends]] is shown commented out, one "# key = default  # what it is" per key
    text = EXAMPLE.read_text()
    for f in fields(config.BackendSettings):
        line = re.search(rf"^# {f.name} = (.+?)\s+# \S", text, re.M)
        assert line, f"[[local.backends]] {f.name} missing from config.example.toml"
        if f.name not in ("name", "api_base"):
            assert tomllib.loads(f"v = {line.group(1)}")["v"] == f.default, f.name
