"""Reading the settings (proxy/config/load.py): where the file is found, TOML coerced to each
field's type, and clear errors for what cannot be read."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy import config
from proxy.errors import ConfigError


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        ({"server": {"port": "eighty"}}, "[server] port = 'eighty': expected an integer"),
        (
            {"quality": {"models": {"gpt-4o": "high"}}},
            "[quality.models] \"gpt-4o\" = 'high': expected a number",
        ),
        ({"quality": {"models": 0.8}}, "[quality] models = 0.8: expected a table"),
        ({"quality": {"model": {}}}, "[quality] model: unknown key"),
        ({"fallback": {"models": {"a": 1}}}, '[fallback.models] "a" = 1: expected a string'),
        ({"ledger": {"pathh": "x"}}, "[ledger] pathh: unknown key"),
        ({"nonsense": {}}, "[nonsense]: unknown section"),
    ],
)
def test_bad_types_and_unknown_keys_name_the_key_the_value_and_the_expectation(
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
