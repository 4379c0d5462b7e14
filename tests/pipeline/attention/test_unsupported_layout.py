"""An encoder–decoder not laid out like Marian or BART (T5: ``block`` lists, relative position bias) is
refused when an attention's heads are attached, in one line naming what is supported, never with an
``AttributeError`` from deep inside."""

from __future__ import annotations

import pytest
from transformers import T5Config, T5ForConditionalGeneration

from pipeline.attention.recording import UnsupportedLayoutError
from pipeline.attention.samsa import SAMSA, attach_samsa
from pipeline.attention.sbm import SBM, attach_sbm
from pipeline.attention.sparsefinder import SPARSEFINDER, attach_predictor
from pipeline.attention.ssa import SSA, attach_ssa
from pipeline.predictors.window import WindowPredictor
from tests.pipeline.attention.test_samsa import SPEC as SAMSA_SPEC
from tests.pipeline.attention.test_sbm import SPEC as SBM_SPEC
from tests.pipeline.attention.test_ssa import LOCAL as SSA_SPEC

ATTACH = {
    SSA: lambda model: attach_ssa(model, SSA_SPEC),
    SBM: lambda model: attach_sbm(model, SBM_SPEC),
    SAMSA: lambda model: attach_samsa(model, SAMSA_SPEC),
    SPARSEFINDER: lambda model: attach_predictor(model, WindowPredictor(), kind="decoder_self", window=3),
}


def tiny_t5(implementation: str) -> T5ForConditionalGeneration:
    config = T5Config(
        vocab_size=40, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_decoder_layers=2, num_heads=2
    )
    model = T5ForConditionalGeneration(config)
    model.config._attn_implementation = implementation
    return model


@pytest.mark.parametrize("implementation", list(ATTACH))
def test_t5_is_refused_at_attach_time_in_one_line(implementation: str) -> None:
    with pytest.raises(UnsupportedLayoutError) as refused:
        ATTACH[implementation](tiny_t5(implementation))
    message = str(refused.value)
    assert "\n" not in message and message.startswith("T5ForConditionalGeneration: its encoder and decoder")
    assert message.endswith(
        "allowed: a Marian- or BART-style encoder–decoder, or any decoder-only or encoder-only model"
    )
