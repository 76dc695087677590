"""``frugal models pull | list | rm``.

    frugal models pull REPO[:QUANT] [--force] [--config PATH]
    frugal models list [--format table|json] [--config PATH]
    frugal models rm REPO[:QUANT] [--force] [--config PATH]

The config is read for ``[local]`` (the fit: ``n_ctx``, ``parallel``, ...; the model in use) and
``[quality] weights_path`` (calibrated or not). Exit 0 on success, 1 when the request cannot be
done (no such repository or quantization, a model that does not fit, a corrupt download, ...),
2 for a bad name or config (``proxy/cli.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from proxy import config as config_mod
from proxy.config.model_name import DEFAULT_QUANT, ModelName
from proxy.models import ModelsError, cache, gate, hub, pull

NAME_HELP = (
    f"a Hugging Face GGUF repository and its quantization (default {DEFAULT_QUANT}), e.g. "
    "bartowski/Qwen2.5-7B-Instruct-GGUF:Q4_K_M"
)


def add_parser(sub: Any) -> None:
    models = sub.add_parser(
        "models", help="pull GGUF models from Hugging Face, list and remove them"
    )
    actions = models.add_subparsers(dest="action", required=True)
    pulling = actions.add_parser(
        "pull",
        help="download a model into the Hugging Face cache, after checking that it fits; "
        "its SHA-256 is verified",
    )
    pulling.add_argument("name", metavar="REPO[:QUANT]", help=NAME_HELP)
    pulling.add_argument(
        "--force", action="store_true", help="download it even if it does not fit the memory"
    )
    listing = actions.add_parser("list", help="the models in the cache, and which one is in use")
    listing.add_argument("--format", choices=("table", "json"), default="table")
    removing = actions.add_parser("rm", help="delete a pulled model from the cache")
    removing.add_argument("name", metavar="REPO[:QUANT]", help=NAME_HELP)
    removing.add_argument(
        "--force", action="store_true", help="remove it even when the config serves it"
    )
    for cmd in (pulling, listing, removing):
        cmd.add_argument("--config", help="TOML config (default: $FRUGAL_CONFIG, ./frugal.toml)")


def run(args: argparse.Namespace) -> int:
    settings = config_mod.load(args.config)
    if args.action == "pull":
        return _pull(args, settings)
    if args.action == "rm":
        return _rm(args, settings)
    return _list(args, settings)


class _BadName(ModelsError):
    """A name on the command line that is not ``REPO[:QUANT]``: a usage error (exit 2)."""

    exit_code = 2


def _name(text: str) -> ModelName:
    try:
        return ModelName.parse(text)
    except ValueError as exc:
        raise _BadName(f"model name {exc}") from exc


def _pull(args: argparse.Namespace, settings: config_mod.Settings) -> int:
    pulled = pull.pull(_name(args.name), settings.local, force=args.force, out=sys.stderr)
    print(
        f"frugal models pull: {pulled.name} is in the cache: {pulled.files[0]} "
        f"({pulled.size / pull.GB:.2f} GB, SHA-256 {pulled.sha256})",
        file=sys.stderr,
    )
    print(pull.next_steps(pulled))
    return 0


def rows(settings: config_mod.Settings) -> list[dict[str, Any]]:
    """One row per cached model: what ``frugal models list`` shows."""
    local, weights = settings.local, settings.quality.weights_path
    serving = ModelName.parse(local.model) if local.model else None
    serving_path = os.path.realpath(local.model_path) if local.model_path else None
    out = []
    for m in cache.cached():
        in_use = m.name == serving or os.path.realpath(m.path) == serving_path
        state = gate.state(weights, m.sha256)
        out.append(
            {
                "name": str(m.name),
                "repo": m.name.repo,
                "quant": m.name.quant,
                "size_bytes": m.size,
                "path": str(m.path),
                "files": len(m.files),
                "in_use": in_use,
                "calibrated": state.calibrated,
                "gate": state.detail,
                "sha256": m.sha256(),
            }
        )
    return out


def _list(args: argparse.Namespace, settings: config_mod.Settings) -> int:
    found = rows(settings)
    if args.format == "json":
        print(json.dumps(found, indent=2))
        return 0
    if not found:
        print(
            "frugal models: the cache holds no model yet; pull one with "
            "`frugal models pull REPO[:QUANT]`",
            file=sys.stderr,
        )
        return 0
    table = [("NAME", "QUANT", "SIZE", "IN USE", "GATE", "PATH")]
    for r in found:
        table.append(
            (
                r["repo"],
                r["quant"],
                f"{r['size_bytes'] / pull.GB:.2f} GB",
                "yes" if r["in_use"] else "",
                "calibrated" if r["calibrated"] else "shipped prior",
                r["path"],
            )
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return 0


def _rm(args: argparse.Namespace, settings: config_mod.Settings) -> int:
    name = _name(args.name)
    model = cache.find(name)
    if model is None:
        raise ModelsError(f"{name} is not in the cache ({hub.cache_dir()})")
    if settings.local.model and ModelName.parse(settings.local.model) == name and not args.force:
        raise ModelsError(
            f"{name} is the model [local] model serves ({settings.source}): frugal serve would "
            "refuse to start without it; change the config first, or rm --force"
        )
    cache.remove(model)
    print(f"frugal models rm: removed {name} ({model.size / pull.GB:.2f} GB)", file=sys.stderr)
    return 0
