"""Models from Hugging Face: ``frugal models pull | list | rm``, and ``[local] model`` at start.

    hub      the one place ``huggingface_hub`` is called (the repository's files, a download)
             and where its errors become :class:`ModelsError`; ``HF_ENDPOINT``, ``HF_TOKEN``,
             ``HF_HUB_OFFLINE`` and the cache folder are read here, when called
    files    which files of a repository hold a quantization (split GGUFs in full), and the
             quantizations a repository has
    cache    the models in the hub's cache, read with no network: resolving ``[local] model``
             to its file at start, listing, removing
    fit      will it fit this machine's RAM, from the file size alone, through the memory
             guard's own estimate (``proxy/engine/memory.py``)
    gate_status  whether the quality gate's weights were fitted for a model file, or it uses the
                 shipped prior (fitted to SmolLM2)
    pull     ``frugal models pull``: pick, fit, download, verify the SHA-256, say what to set

The ``frugal models`` subcommands themselves are in :mod:`proxy.cli.models`.

May import :mod:`proxy.engine` (the memory guard, the GGUF header), :mod:`quality` (the weights
file's tag), :mod:`proxy.config`, :mod:`proxy.errors` and :mod:`proxy.logs` (names from a hub
printed escaped); ``proxy.server`` and ``proxy.cli``
import it, never the other way.
"""

from __future__ import annotations

from proxy.errors import UserError


class ModelsError(UserError):
    """A ``frugal models`` request that cannot be done; its message says why and what to do."""

    label = "frugal models"


class UntrustedDownload(ModelsError):
    """A hub sent what it had not listed (more bytes, another redirect): what came of the file
    is deleted, not kept for a later pull to resume."""
