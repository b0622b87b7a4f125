"""A Llama-family decoder over a flattened mixed batch.

All tokens scheduled in a step go through the linear layers as one `[num_tokens, hidden]` tensor; only
attention knows which request a token belongs to, through the paged KV cache (see attention.py).
Module names mirror Hugging Face's `LlamaForCausalLM`, so a safetensors checkpoint loads as it is; once loaded,
`fuse_projections` packs q/k/v and gate/up into one weight each (the modules' weights become views of it, so
the state dict keeps Hugging Face's names and memory is not doubled): one GEMM instead of three, and of two.
The last layer computes only K/V for the tokens no logit is taken from (`LlamaForCausalLM.forward`), and on the
CPU in fp32 the linear weights are kept in oneDNN's blocked layout (`LlamaForCausalLM.pack_for_cpu`).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .attention import paged_attention
from .config import ModelConfig

PACK_MAX_BYTES = 2 << 30  # `small` has 0.4 GiB of fp32 weights; a 1B model's 5 GiB are not copied


def _linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, packed: torch.Tensor | None
) -> torch.Tensor:
    """F.linear, through the pre-packed oneDNN weight when there is one."""
    if packed is not None and x.shape[0] > 0:
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, bias, "none", [], "")
    return F.linear(x, weight, bias)


def _pack(weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), None)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def rope_inv_freq(config: ModelConfig) -> torch.Tensor:
    """RoPE inverse frequencies, with Llama 3's long-context scaling when the model has it."""
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    if config.rope_scaling is None:
        return inv_freq.float()
    factor, low_freq_factor, high_freq_factor, original_max = config.rope_scaling
    wavelen = 2 * math.pi / inv_freq
    low_freq_wavelen = original_max / low_freq_factor
    high_freq_wavelen = original_max / high_freq_factor
    smooth = (original_max / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    mid = (wavelen <= low_freq_wavelen) & (wavelen >= high_freq_wavelen)
    return torch.where(mid, (1 - smooth) * inv_freq / factor + smooth * inv_freq, scaled).float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE (Hugging Face's layout) on `[num_tokens, heads, head_dim]`."""
    x1, x2 = x.float().chunk(2, dim=-1)
    rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return rotated.to(x.dtype)


class LlamaAttention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, config.head_dim
        h = config.hidden_size
        self.q_proj = nn.Linear(h, config.q_size, bias=config.qkv_bias)
        self.k_proj = nn.Linear(h, config.kv_size, bias=config.qkv_bias)
        self.v_proj = nn.Linear(h, config.kv_size, bias=config.qkv_bias)
        self.o_proj = nn.Linear(config.q_size, h, bias=False)
        self.scale = self.head_dim**-0.5
        self.k_cache = self.v_cache = torch.empty(0)  # set by the executor
        self.qkv_weight: torch.Tensor | None = None  # set by fuse_projections
        self.qkv_bias: torch.Tensor | None = None
        self.packed: dict[str, torch.Tensor] = {}  # set by pack_for_cpu

    def fuse_projections(self) -> None:
        projections = (self.q_proj, self.k_proj, self.v_proj)
        self.qkv_weight = _fuse([p.weight for p in projections])
        if self.q_proj.bias is not None:
            self.qkv_bias = _fuse([p.bias for p in projections])

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rows: torch.Tensor | None = None
    ) -> torch.Tensor:
        """`rows`: every token's K/V is cached, but only these tokens attend (the rows of the output)."""
        heads, kv_heads = self.num_heads, self.num_kv_heads
        if self.qkv_weight is None:
            qkv = torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1)
        else:
            qkv = _linear(x, self.qkv_weight, self.qkv_bias, self.packed.get("qkv"))
        qkv = qkv.view(x.shape[0], heads + 2 * kv_heads, self.head_dim)
        qk = apply_rope(qkv[:, : heads + kv_heads], cos, sin)  # q and k heads rotated in one pass
        q, k, v = qk[:, :heads], qk[:, heads:], qkv[:, heads + kv_heads :]
        if rows is not None:
            q = q[rows]
        out = paged_attention(q, k, v, self.k_cache, self.v_cache, self.scale, sampled_only=rows is not None)
        return _linear(out.flatten(1), self.o_proj.weight, None, self.packed.get("o"))


class LlamaMLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.gate_up_weight: torch.Tensor | None = None  # set by fuse_projections
        self.packed: dict[str, torch.Tensor] = {}  # set by pack_for_cpu

    def fuse_projections(self) -> None:
        self.gate_up_weight = _fuse([self.gate_proj.weight, self.up_proj.weight])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up_weight is None:
            gate, up = self.gate_proj(x), self.up_proj(x)
        else:
            gate, up = _linear(x, self.gate_up_weight, None, self.packed.get("gate_up")).chunk(2, dim=-1)
        # SiLU's output times up in place: three [n, intermediate] widths at the peak, as vLLM's fused
        # gate_up + act and engine/activation.py's formula (a new product tensor would make it four)
        return _linear(F.silu(gate).mul_(up), self.down_proj.weight, None, self.packed.get("down"))


def _fuse(params: list[torch.Tensor]) -> torch.Tensor:
    """Concatenate parameters along dim 0 and make each a view of the result (copy once, share after)."""
    fused = torch.cat([p.detach() for p in params])
    start = 0
    for p in params:
        p.data = fused[start : start + p.shape[0]]
        start += p.shape[0]
    return fused


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(config)
        self.mlp = LlamaMLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rows: torch.Tensor | None = None
    ) -> torch.Tensor:
        # # one expression, so the attention's output is freed before the MLP runs (engine/activation.py's
        # peak)
        x = (x if rows is None else x[rows]) + self.self_attn(self.input_layernorm(x), cos, sin, rows)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.register_buffer("inv_freq", rope_inv_freq(config), persistent=False)
        self.lm_head_packed: torch.Tensor | None = None  # set by pack_for_cpu

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Hidden states `[num_tokens, hidden]` after the final norm; with `rows` (the tokens whose logits the
        step samples, each its request's last), those rows only. No other token's last-layer output reaches
        a logit, so the last layer computes only their K/V: its attention, o_proj and MLP run on `rows` alone
        (a 2048-token prompt's last layer: one row instead of 2048; a chunk that samples nothing: none). Exact,
        and 1/num_layers of a prefill step's work saved (vLLM computes every row and then selects)."""
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        cos, sin = freqs.cos()[:, None, :], freqs.sin()[:, None, :]  # broadcast over heads
        x = self.model.embed_tokens(input_ids)
        *layers, last = self.model.layers
        for layer in layers:
            x = layer(x, cos, sin)
        return self.model.norm(last(x, cos, sin, rows))

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return _linear(hidden, self.lm_head.weight, None, self.lm_head_packed).float()

    def pack_for_cpu(self) -> bool:
        """Keep oneDNN-packed copies of the linear weights, reordered once (as vLLM's CPU build does), which
        every step's products then use: a plain F.linear goes through MKL's sgemm, which re-packs its weight on
        every call and reaches about half oneDNN's rate (docs/measurements/engine-speed.md). It costs a second
        copy of the weights; False where it does not apply: not the CPU, not fp32, no oneDNN, or weights of
        PACK_MAX_BYTES or more."""
        weight = self.lm_head.weight
        size = sum(p.numel() * p.element_size() for p in self.parameters())
        if (
            weight.device.type != "cpu"
            or weight.dtype != torch.float32
            or size >= PACK_MAX_BYTES
            or not torch.backends.mkldnn.is_available()
        ):
            return False
        for layer in self.model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            attn.packed = {"qkv": _pack(attn.qkv_weight), "o": _pack(attn.o_proj.weight)}
            mlp.packed = {"gate_up": _pack(mlp.gate_up_weight), "down": _pack(mlp.down_proj.weight)}
        self.lm_head_packed = _pack(weight)
        return True

    def load_hf_weights(self, path: str | Path) -> None:
        """Load every `*.safetensors` file of a Hugging Face checkpoint directory."""
        from safetensors.torch import load_file

        files = sorted(Path(path).glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"no *.safetensors files in {path}")
        state = {}
        for file in files:
            state.update(load_file(str(file)))
        if self.config.tie_word_embeddings:
            state.pop("lm_head.weight", None)
        missing, unexpected = self.load_state_dict(state, strict=False)
        missing = [k for k in missing if not (self.config.tie_word_embeddings and k == "lm_head.weight")]
        unexpected = [k for k in unexpected if "rotary_emb" not in k]
        if missing or unexpected:
            raise ValueError(
                f"checkpoint {path} does not match the model: missing {missing[:5]}, unexpected {unexpected[:5]}"
            )


def build_model(config: ModelConfig, dtype: torch.dtype, device: torch.device, seed: int) -> LlamaForCausalLM:
    """Seeded dummy weights (default PyTorch init), or the checkpoint in `config.hf_dir`."""
    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaForCausalLM(config)
    if config.hf_dir:
        model.load_hf_weights(config.hf_dir)
    model = model.to(dtype=dtype).eval()
    model.inv_freq = model.inv_freq.float()  # RoPE angles stay fp32 whatever the weights' dtype
    for layer in model.model.layers:  # last: a later .to() would copy the views apart from the fused weight
        layer.self_attn.fuse_projections()
        layer.mlp.fuse_projections()
    model.pack_for_cpu()
    return model
