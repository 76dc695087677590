from __future__ import annotations

import re
import tomllib
from dataclasses import fields
from pathlib import Path

import pytest

from proxy import config
from proxy.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
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


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        ({"server": {"port": "eighty"}}, "[server] port = 'eighty': expected an integer"),
        ({"server": {"port": 70000}}, "[server] port = 70000"),
        ({"local": {"speculative": "fast"}}, "[local] speculative = 'fast'"),
        ({"local": {"speculative": "draft"}}, "needs [local] draft_model_path"),
        ({"quality": {"threshold": 1.5}}, "[quality] threshold = 1.5"),
        ({"fallback": {"api_base": "ftp://x"}}, "[fallback] api_base = 'ftp://x'"),
        (
            {"quality": {"models": {"gpt-4o": "high"}}},
            "[quality.models] \"gpt-4o\" = 'high': expected a number",
        ),
        (
            {"quality": {"models": {"gpt-4o": 1.5}}},
            '[quality.models] "gpt-4o" = 1.5: expected a value between 0.0 and 1.0',
        ),
        ({"quality": {"models": 0.8}}, "[quality] models = 0.8: expected a table"),
        ({"quality": {"model": {}}}, "[quality] model: unknown key"),
        ({"fallback": {"models": {"a": 1}}}, '[fallback.models] "a" = 1: expected a string'),
        ({"ledger": {"pathh": "x"}}, "[ledger] pathh: unknown key"),
        ({"costs": {"monthly_fixed_usd": -1}}, "[costs] monthly_fixed_usd = -1.0"),
        ({"nonsense": {}}, "[nonsense]: unknown section"),
    ],
)
def test_bad_values_name_the_key_the_value_and_the_expectation(
    raw: dict[str, object], needle: str
) -> None:
    with pytest.raises(ConfigError) as info:
        config.from_dict(raw)
    assert needle in str(info.value)


def test_quality_models_table_maps_requested_models_to_thresholds(tmp_path: Path) -> None:
    path = tmp_path / "frugal.toml"
    path.write_text(
        '[quality]\nthreshold = 0.6\n[quality.models]\n"gpt-4o" = 0.8\n"gpt-4o-mini" = 0\n'
    )
    quality = config.load(str(path)).quality
    assert quality.threshold == 0.6
    assert quality.models == {"gpt-4o": 0.8, "gpt-4o-mini": 0.0}
    assert all(isinstance(v, float) for v in quality.models.values())


def test_config_path_comes_from_flag_then_env_then_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FRUGAL_CONFIG", raising=False)
    assert config.resolve_path(None) is None
    (tmp_path / "frugal.toml").write_text("[server]\nport = 9001\n")
    assert config.load(None).server.port == 9001
    env_file = tmp_path / "env.toml"
    env_file.write_text("[server]\nport = 9002\n")
    monkeypatch.setenv("FRUGAL_CONFIG", str(env_file))
    assert config.load(None).server.port == 9002
    flag_file = tmp_path / "flag.toml"
    flag_file.write_text("[server]\nport = 9003\n")
    assert config.load(str(flag_file)).server.port == 9003


def test_missing_or_broken_config_files_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        config.load(str(tmp_path / "nope.toml"))
    broken = tmp_path / "broken.toml"
    broken.write_text("[server\nport=")
    with pytest.raises(ConfigError, match="invalid TOML"):
        config.load(str(broken))


def test_fallback_is_enabled_only_when_its_key_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert not config.FallbackSettings().enabled
    monkeypatch.setenv("OPENAI_API_KEY", "sk-x")
    assert config.FallbackSettings().enabled
    assert config.FallbackSettings(api_base="http://127.0.0.1:1/v1", api_key_env="").enabled
    assert not config.FallbackSettings(api_base="", api_key_env="").enabled
