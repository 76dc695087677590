"""A model that thinks, for tests: the bundled SmolLM2 with a Qwen3-style chat template.

:func:`thinking_gguf` writes a copy of the bundled GGUF whose ``tokenizer.chat_template`` is
:data:`THINKING_TEMPLATE` (with the ``gguf`` package's own metadata copier), into a test's
temporary folder; no model file is ever committed. The template is ChatML (SmolLM2's own turns)
whose generation prompt opens a ``<think>`` block, and which honours ``enable_thinking``: false,
it writes the empty block Qwen3 writes, and the model answers at once. It drops the thinking of
earlier assistant turns, as Qwen3's does.

SmolLM2 does not really think: whatever it writes after the opened block, up to ``</think>``,
is its thinking. Tests that need the block closed at a known place force it with a grammar.
"""

from __future__ import annotations

from pathlib import Path

THINKING_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' }}"
    "{%- set content = message.content or '' %}"
    "{%- if message.role == 'assistant' and '</think>' in content %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}"
    "{%- endif %}"
    "{{- content + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- else %}"
    "{{- '<think>\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
)


def thinking_gguf(folder: Path, template: str = THINKING_TEMPLATE) -> Path:
    """A copy of the bundled SmolLM2 GGUF with ``template`` as its chat template, in
    ``folder``; returns its path."""
    import gguf
    from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata

    from proxy.engine.model_files import bundled_model_path

    source = bundled_model_path()
    target = folder / "smollm2-thinking.gguf"
    reader = gguf.GGUFReader(source, "r")
    arch = reader.get_field(gguf.Keys.General.ARCHITECTURE)
    assert arch is not None
    writer = gguf.GGUFWriter(str(target), arch=arch.contents(), endianess=reader.endianess)
    alignment = reader.get_field(gguf.Keys.General.ALIGNMENT)
    if alignment is not None:
        writer.data_alignment = alignment.contents()
    new = {gguf.Keys.Tokenizer.CHAT_TEMPLATE: MetadataDetails(gguf.GGUFValueType.STRING, template)}
    copy_with_new_metadata(reader, writer, new, [])
    writer.close()
    return target
