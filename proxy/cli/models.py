"""The model files' commands: ``frugal models pull | list | rm``, ``quantize``, ``calibrate``.

    frugal models pull REPO[:QUANT] [--force] [--stall-timeout SECONDS] [--config PATH]
    frugal models list [--format table|json] [--config PATH]
    frugal models rm REPO[:QUANT] [--force] [--config PATH]
    frugal quantize IN.gguf OUT.gguf [--type Q4_K_M] [--force]
    frugal calibrate [--config PATH] [--db PATH|URL] [--out PATH]

The config is read for ``[local]`` (the fit: ``n_ctx``, ``parallel``, ...; the model in use) and
``[quality] weights_path`` (calibrated or not). Exit 0 on success, 1 when the request cannot be
done (no such repository or quantization, a model that does not fit, a corrupt download, ...),
2 for a bad name or config. ``frugal quantize`` (:mod:`proxy.engine.quantize`) exits 1 when the
file cannot be written; ``frugal calibrate`` (:mod:`proxy.audit.refit`) refits the quality
gate on the model's audits and exits 1 when there are too few of them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Any

from proxy import config as config_mod
from proxy.cli.ledger import DB_HELP
from proxy.config.model_name import DEFAULT_QUANT, ModelName
from proxy.errors import ConfigError
from proxy.logs import shown
from proxy.models import ModelsError, cache, gate_status, hub, pull
from proxy.models.cache import resolve as resolve_model

NAME_HELP = (
    f"a Hugging Face GGUF repository and its quantization (default {DEFAULT_QUANT}), e.g. "
    "bartowski/Qwen2.5-7B-Instruct-GGUF:Q4_K_M"
)


def add_parsers(sub: Any) -> None:
    _add_models(sub)
    quantize = sub.add_parser(
        "quantize", help="requantize a GGUF with llama.cpp (Q4_K_M is recommended on a CPU)"
    )
    quantize.add_argument("source", metavar="IN.gguf")
    quantize.add_argument("target", metavar="OUT.gguf")
    quantize.add_argument("--type", default="Q4_K_M", help="target format (default Q4_K_M)")
    quantize.add_argument("--force", action="store_true", help="overwrite OUT.gguf")
    quantize.set_defaults(run=_quantize)
    calibrate = sub.add_parser(
        "calibrate",
        help="refit the quality gate on the audits of the configured model; write a weights "
        "file for [quality] weights_path",
    )
    calibrate.add_argument("--config", help="TOML config: its model, [ledger] and [quality]")
    calibrate.add_argument("--db", help=DB_HELP + " (default: the config's [ledger])")
    calibrate.add_argument(
        "--out",
        help="weights file to write (default: [quality] weights_path, else frugal-weights.json)",
    )
    calibrate.set_defaults(run=_calibrate)


def _add_models(sub: Any) -> None:
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
    pulling.add_argument(
        "--stall-timeout",
        type=_seconds,
        default=hub.STALL_S,
        metavar="SECONDS",
        help="fail the download when it brings less than 64 KiB in this many seconds (a hub "
        f"that has stalled, or drips bytes; default {hub.STALL_S:g})",
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
        cmd.set_defaults(run=_models)


def _quantize(args: argparse.Namespace) -> int:
    from proxy.engine import quantize

    return quantize.run(args.source, args.target, args.type, args.force)


def _calibrate(args: argparse.Namespace) -> int:
    from proxy.audit.refit import run_once, write_weights
    from proxy.engine.generate import bundled_model_path
    from proxy.ledger.db.location import from_argument, from_settings

    settings = resolve_model(config_mod.load(args.config))
    db = from_argument(args.db) if args.db else from_settings(settings.ledger)
    model_path = settings.local.model_path or bundled_model_path()
    if not os.path.isfile(model_path):
        raise ConfigError(f"[local] model_path = {model_path!r}: no such file")
    out = args.out or settings.quality.weights_path or "frugal-weights.json"
    target = getattr(settings.quality, "target_precision", 0.0) or None
    result = run_once(
        db, model_path, target=target, configured_threshold=settings.quality.threshold
    )
    write_weights(out, result.weights)
    print("\n".join(result.report()))
    print(
        f"frugal calibrate: wrote {out} (for {os.path.basename(model_path)}); set [quality] "
        "weights_path to it",
        file=sys.stderr,
    )
    return 0


def _models(args: argparse.Namespace) -> int:
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


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds above 0, got {text!r}")
    return value


def _pull(args: argparse.Namespace, settings: config_mod.Settings) -> int:
    pulled = pull.pull(
        _name(args.name),
        settings.local,
        force=args.force,
        stall_s=args.stall_timeout,
        out=sys.stderr,
    )
    print(
        f"frugal models pull: {pulled.name} is in the cache: {shown(str(pulled.files[0]))} "
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
        state = gate_status.state(weights, m.sha256)
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
                shown(r["path"]),
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
