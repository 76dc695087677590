"""``[local] model = "REPO:QUANT"``: found in the hub cache at start, with no network.

The model is pulled from the stand-in hub first (the real pull), then the hub is put in
``HF_HUB_OFFLINE=1`` and made to answer 503 to anything: the app starts on the cached file and
answers a chat from the real SmolLM2, and the hub sees no request. A model that was never pulled
stops the start with the command that pulls it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from proxy import config
from proxy.cli import main
from proxy.cli.check import check
from proxy.errors import ConfigError
from proxy.server.app import create_app
from quality.combiner import MODEL_TAG, WEIGHTS_PATH
from tests.conftest import settings_for
from tests.models.conftest import GEMMA, SMOL, SMOL_FILE
from tests.models.hub_server import COMMIT, StandInHub

NAME = f"{SMOL}:Q4_1"


@pytest.fixture
def offline(hub: StandInHub, monkeypatch: pytest.MonkeyPatch) -> Iterator[StandInHub]:
    """SmolLM2 pulled into the cache, then no network: HF_HUB_OFFLINE=1 and a hub that is down."""
    assert main(["models", "pull", NAME]) == 0
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub.requests.clear()
    hub.down = True
    yield hub
    assert hub.requests == []  # nothing asked the hub


async def test_the_app_serves_a_model_named_by_repo_and_quant(
    offline: StandInHub, tmp_path: Path
) -> None:
    weights = tmp_path / "frugal-weights.json"  # auto_calibrate: written after 100 audits
    settings = settings_for(
        tmp_path,
        local={"model": NAME, "parallel": 1},
        quality={"relevance": False, "weights_path": str(weights), "auto_calibrate": True},
    )
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://localhost", timeout=60
        ) as client:
            reply = await client.post(
                "/v1/chat/completions",
                json={
                    "model": "local",
                    "messages": [{"role": "user", "content": "Say hello."}],
                    "max_tokens": 8,
                    "temperature": 0,
                },
            )
            health = (await client.get("/healthz")).json()
            # A refit for this model's SHA-256 lands (what auto_calibrate writes): /healthz
            # says so at once.
            sha = offline.repos[SMOL][SMOL_FILE].sha256
            fitted = json.loads(WEIGHTS_PATH.read_text(encoding="utf-8"))
            weights.write_text(json.dumps({**fitted, MODEL_TAG: sha}), encoding="utf-8")
            refitted = (await client.get("/healthz")).json()
    assert reply.status_code == 200, reply.text
    assert reply.headers["x-frugal-route"] == "local"
    assert reply.json()["choices"][0]["message"]["content"]
    snapshot_file = f"snapshots/{COMMIT}/{SMOL_FILE}"
    assert health["engine"]["state"] == "ready"
    assert app.state.services.engine.model_path.endswith(snapshot_file)
    assert health["gate"] == {
        "weights": "shipped_prior",
        "calibrated": False,
        "detail": "the gate uses the shipped prior, fitted to SmolLM2 (not calibrated for this "
        f"model yet; {weights} holds no weights fitted for it)",
    }
    assert refitted["gate"] == {
        "weights": "calibrated",
        "calibrated": True,
        "detail": f"the gate is calibrated for this model ({weights})",
    }


def test_a_model_not_pulled_is_refused_at_start_with_the_pull_command(
    hub: StandInHub,
    tmp_path: Path,
) -> None:
    settings = settings_for(tmp_path, local={"model": "test-org/Never-Pulled-GGUF"})
    with pytest.raises(ConfigError) as refused:
        create_app(settings)
    assert "run `frugal models pull test-org/Never-Pulled-GGUF:Q4_K_M` first" in str(refused.value)
    assert "never downloads a model at start" in str(refused.value)
    assert hub.requests == []


def test_frugal_check_reports_the_cached_model_its_fit_and_its_gate(
    offline: StandInHub, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "frugal.toml"
    cfg.write_text(
        f'[local]\nmodel = "{NAME}"\n[fallback]\napi_base = ""\n'
        f'[ledger]\npath = "{tmp_path / "ledger.db"}"\n',
        encoding="utf-8",
    )
    capsys.readouterr()
    assert check(str(cfg)) == 0
    out = capsys.readouterr().out
    assert f"ok   model: {tmp_path / 'hf-cache'}" in out and "(llama, Q4_1" in out
    assert "ok   chat template: the model's own (tokenizer.chat_template, " in out
    assert "ok   memory: about " in out and "parallel 4" in out
    assert (
        "warn gate: the gate uses the shipped prior, fitted to SmolLM2 (not calibrated for this "
        "model yet; [quality] weights_path is not set)"
    ) in out


def test_frugal_serve_and_check_refuse_a_model_not_pulled(
    hub: StandInHub,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    cfg = tmp_path / "frugal.toml"
    cfg.write_text('[local]\nmodel = "test-org/Never-Pulled-GGUF:Q5_K_M"\n', encoding="utf-8")
    assert main(["serve", "--config", str(cfg)]) == 2
    assert "frugal models pull test-org/Never-Pulled-GGUF:Q5_K_M" in capsys.readouterr().err
    assert check(str(cfg)) == 1
    out = capsys.readouterr().out
    assert 'FAIL model: [local] model = "test-org/Never-Pulled-GGUF:Q5_K_M" is not in the' in out
    assert "fix: frugal models pull test-org/Never-Pulled-GGUF:Q5_K_M" in out
    assert hub.requests == []


def test_model_and_model_path_together_are_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as both:
        config.from_dict({"local": {"model": NAME, "model_path": "/m.gguf"}}, source="<t>")
    assert "[local] model = " in str(both.value) and "[local] model_path = '/m.gguf'" in str(
        both.value
    )
    with pytest.raises(ConfigError, match=r"\[local\] model = 'a/b/c': expected a Hugging Face"):
        config.from_dict({"local": {"model": "a/b/c"}}, source="<t>")


def test_the_report_and_the_list_say_whether_the_gate_is_calibrated(
    offline: StandInHub, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    weights = tmp_path / "frugal-weights.json"
    cfg = tmp_path / "frugal.toml"
    cfg.write_text(
        f'[local]\nmodel = "{NAME}"\n[quality]\nweights_path = "{weights}"\n'
        f'[ledger]\npath = "{tmp_path / "ledger.db"}"\n',
        encoding="utf-8",
    )
    assert main(["migrate", "--config", str(cfg)]) == 0  # an empty ledger
    capsys.readouterr()
    assert main(["report", "--config", str(cfg), "--format", "json"]) == 4  # no request yet
    report = json.loads(capsys.readouterr().out)
    assert report["gate"]["weights"] == "shipped_prior"
    assert main(["report", "--config", str(cfg)]) == 4
    assert "│ Quality gate        │ the gate uses the shipped prior, fitted to SmolLM2" in (
        capsys.readouterr().out
    )

    # A weights file fitted for this model's SHA-256 (what frugal calibrate writes).
    sha = offline.repos[SMOL][SMOL_FILE].sha256
    fitted = json.loads(WEIGHTS_PATH.read_text(encoding="utf-8"))
    weights.write_text(json.dumps({**fitted, MODEL_TAG: sha}), encoding="utf-8")
    assert main(["report", "--config", str(cfg), "--format", "json"]) == 4
    assert json.loads(capsys.readouterr().out)["gate"] == {
        "weights": "calibrated",
        "calibrated": True,
        "detail": f"the gate is calibrated for this model ({weights})",
    }
    assert main(["models", "list", "--format", "json", "--config", str(cfg)]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["in_use"] is True and row["calibrated"] is True and row["sha256"] == sha
    assert check(str(cfg)) == 0
    assert f"ok   gate: the gate is calibrated for this model ({weights})" in (
        capsys.readouterr().out
    )


def test_frugal_check_refuses_a_pulled_base_model_without_a_chat_template(
    hub: StandInHub, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["models", "pull", GEMMA]) == 0  # Q4_K_M, the default
    cfg = tmp_path / "frugal.toml"
    cfg.write_text(f'[local]\nmodel = "{GEMMA}"\n[fallback]\napi_base = ""\n', encoding="utf-8")
    capsys.readouterr()
    assert check(str(cfg)) == 1
    out = capsys.readouterr().out
    assert "(gemma3, Q4_K_M" in out
    assert "FAIL model: " in out and "has no chat template" in out
    assert "ok   chat template" not in out
