"""The README and deploy/README.md show the model commands as the CLI takes them.

The README's set-up block serves the bundled model first, with no download, and its third line
pulls a real model by a name ``frugal models pull`` accepts. deploy/README.md pulls a model and
serves it by the same name, and its calibration step is a config that turns on the audits and
the refit.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from proxy.config import from_dict
from proxy.config.model_name import DEFAULT_QUANT, ModelName

ROOT = Path(__file__).resolve().parents[2]


def _blocks(path: Path, lang: str) -> list[str]:
    return re.findall(rf"^ *```{lang}\n(.*?)^ *```", path.read_text(encoding="utf-8"), re.M | re.S)


def test_the_readme_serves_the_bundled_model_first_and_pulls_a_real_one_third() -> None:
    first = [
        line.split("#")[0].split() for line in _blocks(ROOT / "README.md", "sh")[0].splitlines()
    ]
    assert first[0] == ["./dev", "serve"]  # the bundled model, no download
    assert first[1] == ["./dev", "test"]
    assert first[2][:3] == [".venv/bin/frugal", "models", "pull"] and len(first[2]) == 4
    assert ModelName.parse(first[2][3]).quant == DEFAULT_QUANT


def test_deploy_readme_serves_the_model_it_pulls_and_calibrates_the_gate_for_it() -> None:
    deploy = ROOT / "deploy" / "README.md"
    pulled = {
        str(ModelName.parse(m))
        for m in re.findall(r"frugal models pull ([\w.-]+/[\w.:-]+)", deploy.read_text("utf-8"))
    }
    configs = [
        from_dict(tomllib.loads(re.sub(r"^ +", "", b, flags=re.M)), source="deploy/README.md")
        for b in _blocks(deploy, "toml")
    ]
    served = {c.local.model for c in configs if c.local.model}
    assert pulled and served == pulled
    assert any(c.audit.rate > 0 and c.quality.auto_calibrate and c.quality.weights_path
               for c in configs)  # fmt: skip
