"""The settings' ranges and rules (proxy/config/checks.py): ``validate`` holds settings made in
code to the same rules as a loaded file, naming the key, the value and what was expected."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest

from proxy import config
from proxy.errors import ConfigError


@pytest.mark.parametrize(
    ("section", "values", "needle"),
    [
        ("server", {"port": 70000}, "[server] port = 70000"),
        ("local", {"speculative": "fast"}, "[local] speculative = 'fast'"),
        ("local", {"speculative": "draft"}, "needs [local] draft_model_path"),
        ("quality", {"threshold": 1.5}, "[quality] threshold = 1.5"),
        ("fallback", {"api_base": "ftp://x"}, "[fallback] api_base = 'ftp://x'"),
        ("fallback", {"responses": "chat"}, "[fallback] responses = 'chat'"),
        ("fallback", {"flex_timeout_s": 0.0}, "[fallback] flex_timeout_s = 0.0"),
        (
            "quality",
            {"models": {"gpt-4o": 1.5}},
            '[quality.models] "gpt-4o" = 1.5: expected a value between 0.0 and 1.0',
        ),
        ("costs", {"monthly_fixed_usd": -1.0}, "[costs] monthly_fixed_usd = -1.0"),
        ("ledger", {"url": "postgresql://u:pw@h/db"}, "[ledger] url: holds a password"),
    ],
)
def test_values_out_of_range_name_the_key_the_value_and_the_expectation(
    section: str, values: dict[str, Any], needle: str
) -> None:
    defaults = config.Settings()
    changed = dataclasses.replace(getattr(defaults, section), **values)
    with pytest.raises(ConfigError, match=re.escape(needle)):
        config.validate(dataclasses.replace(defaults, **{section: changed}))


def test_the_same_values_are_refused_when_read_from_toml() -> None:
    with pytest.raises(ConfigError, match=re.escape("[server] port = 70000")):
        config.from_dict({"server": {"port": 70000}})
    assert config.validate(config.Settings()) == config.Settings()
