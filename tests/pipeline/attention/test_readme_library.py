"""The README's library section runs as written: every implementation attaches to a model the user brings
(a tiny random Llama with grouped-query heads, saved as a plain Hugging Face folder), and ``load_model``
gives back a saved folder's logits."""

from __future__ import annotations

import re
from pathlib import Path

import torch
from transformers import LlamaForCausalLM

from pipeline.attention import ENTMAX, attach_learned_alpha
from pipeline.checkpoint import save_checkpoint
from tests.tiny import tiny_llama

README = Path(__file__).resolve().parents[3] / "README.md"
SECTION = ("## Using the attention in any Hugging Face model", "The kernels on their own")


def library_blocks() -> list[str]:
    """The python code blocks of the README's library section, in order."""
    text = README.read_text()
    start, end = text.index(SECTION[0]), text.index(SECTION[1])
    return re.findall(r"```python\n(.*?)```", text[start:end], flags=re.DOTALL)


def test_the_library_section_runs_and_reloads_a_saved_folder(tmp_path):
    tiny_llama(vocab=50).save_pretrained(tmp_path / "llama")  # the user's own model, no manifest
    model = LlamaForCausalLM.from_pretrained(tmp_path / "llama", attn_implementation=ENTMAX)
    attach_learned_alpha(model)
    with torch.no_grad():
        model.model.layers[0].self_attn.entmax_alpha.theta.uniform_(-1.0, 1.0)
    save_checkpoint(tmp_path / "saved", model, None, {"stage": "test"})
    ids = torch.randint(0, 50, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model(input_ids=ids).logits

    blocks = library_blocks()
    assert len(blocks) == 3 and "attach_samsa(model" in blocks[1]
    namespace = {"path": str(tmp_path / "llama"), "folder": str(tmp_path / "saved")}
    for block in blocks:
        exec(compile(block, str(README), "exec"), namespace)  # the README's own code
        if "attach_samsa(model" in block:  # the last model the attach lines built runs its heads
            with torch.no_grad():
                namespace["model"](input_ids=ids)
            assert namespace["model"].config.samsa["kinds"] == ["decoder_self"]
    with torch.no_grad():
        assert torch.equal(namespace["model"](input_ids=ids).logits, expected)
