"""The CPU's pre-packed linear weights (engine/model.py `pack_for_cpu`): the same products as the dense
weights within fp32 rounding, used for steps of every size, and not made where they do not apply."""

import pytest
import torch
from chunkbench.engine import model as model_module
from chunkbench.engine.model import build_model
from chunkbench.engine.model_config import ModelConfig

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="no oneDNN in this torch")


def tiny(dtype=torch.float32):
    return build_model(ModelConfig.from_name("tiny"), dtype, torch.device("cpu"), seed=0)


def test_packed_products_equal_the_dense_ones_at_every_step_size(monkeypatch):
    model = tiny()
    assert model.lm_head_packed is not None and set(model.model.layers[0].mlp.packed) == {"gate_up", "down"}
    calls = []
    pointwise = torch.ops.mkldnn._linear_pointwise
    monkeypatch.setattr(
        model_module.torch.ops.mkldnn,
        "_linear_pointwise",
        lambda x, *a: calls.append(x.shape[0]) or pointwise(x, *a),
        raising=False,
    )
    for rows in (1, 32, 128, 129, 2048):
        hidden = torch.randn(rows, model.config.hidden_size)
        calls.clear()
        packed = model.compute_logits(hidden)
        assert calls == [rows], rows
        dense = torch.nn.functional.linear(hidden, model.lm_head.weight)
        torch.testing.assert_close(packed, dense, rtol=1e-5, atol=1e-5)
    mlp = model.model.layers[0].mlp
    x = torch.randn(8, model.config.hidden_size)
    with_packed = mlp(x)
    mlp.packed = {}
    torch.testing.assert_close(with_packed, mlp(x), rtol=1e-5, atol=1e-5)


def test_no_packing_off_fp32_or_past_the_size_limit(monkeypatch):
    assert tiny(torch.float16).lm_head_packed is None
    monkeypatch.setattr(model_module, "PACK_MAX_BYTES", 1024)  # `tiny` has ~7 MB of weights
    model = tiny()
    assert model.lm_head_packed is None and model.model.layers[0].self_attn.packed == {}
