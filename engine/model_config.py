"""The model's shape (ModelConfig): from a preset's name (engine/presets.py holds their numbers) or a Hugging
Face directory's config.json; and ConfigError, the one error a bad configuration raises. The bottom of the
config layer: engine/config.py, presets and sharding build on it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from chunkbench.errors import ConfigError

from .presets import PRESET_SHAPES


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _positive(name: str, value: int | float) -> None:
    _require(value > 0, f"{name} must be > 0, got {value}")


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a Llama-family decoder. Shapes, not weights, are what performance depends on."""

    name: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_model_len: int
    rope_theta: float = 10000.0
    # llama3 rope scaling as (factor, low_freq_factor, high_freq_factor, original_max_position); None = plain RoPE.
    rope_scaling: tuple[float, float, float, int] | None = None
    rms_norm_eps: float = 1e-5
    qkv_bias: bool = False
    tie_word_embeddings: bool = False
    eos_token_id: int | None = None
    hf_dir: str | None = None  # where real weights live; None = seeded dummy weights

    def __post_init__(self) -> None:
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "max_model_len",
        ):
            _positive(f"model.{name}", getattr(self, name))
        _require(
            self.num_heads % self.num_kv_heads == 0,
            f"model.num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})",
        )

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def num_linear_params(self) -> int:
        """Weights of the decoder layers' matrices, which every token goes through (no embeddings, LM head,
        norms or biases): what a step's GEMM FLOPs and weight reads scale with."""
        h = self.hidden_size
        return self.num_layers * (
            h * (self.q_size + 2 * self.kv_size) + self.q_size * h + 3 * h * self.intermediate_size
        )

    @property
    def num_params(self) -> int:
        """Parameter count (weights only, norms included)."""
        h = self.hidden_size
        per_layer_extra = 2 * h + (self.q_size + 2 * self.kv_size if self.qkv_bias else 0)  # norms, biases
        embeddings = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return self.num_linear_params + self.num_layers * per_layer_extra + embeddings + h

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """K and V of one token over every layer."""
        return 2 * self.num_layers * self.kv_size * dtype_bytes

    @classmethod
    def from_name(cls, name: str) -> ModelConfig:
        """A preset by name, or a Hugging Face model directory (a path holding config.json)."""
        if name in MODEL_PRESETS:
            return MODEL_PRESETS[name]
        if Path(name).is_dir():
            return cls.from_hf_dir(name)
        raise ConfigError(
            f"--model: unknown model '{name}'; presets are {', '.join(MODEL_PRESETS)}, "
            "or give a local Hugging Face directory"
        )

    @classmethod
    def from_hf_dir(cls, path: str | Path) -> ModelConfig:
        """Read a Hugging Face config.json (Llama, Mistral, Qwen2 architectures)."""
        config_path = Path(path) / "config.json"
        try:
            hf = json.loads(config_path.read_text())
            return cls._from_hf(hf, path)
        except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"--model: cannot read {config_path}: {exc}") from None
        except KeyError as exc:
            raise ConfigError(f"--model: {config_path} has no {exc} (not a Llama, Mistral or Qwen2 config)") from None
        except (TypeError, ValueError, AttributeError) as exc:
            raise ConfigError(f"--model: {config_path} has a value of the wrong type: {exc}") from None

    @classmethod
    def _from_hf(cls, hf: dict, path: str | Path) -> ModelConfig:
        heads = hf["num_attention_heads"]
        scaling = hf.get("rope_scaling") or (hf.get("rope_parameters") or {})
        rope_type = scaling.get("rope_type", scaling.get("type"))
        rope_scaling = None
        if rope_type == "llama3":
            rope_scaling = (
                float(scaling["factor"]),
                float(scaling["low_freq_factor"]),
                float(scaling["high_freq_factor"]),
                int(scaling["original_max_position_embeddings"]),
            )
        theta = hf.get("rope_theta", (hf.get("rope_parameters") or {}).get("rope_theta", 10000.0))
        eos = hf.get("eos_token_id")
        return cls(
            name=Path(path).name,
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_layers=hf["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=hf.get("num_key_value_heads", heads),
            head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
            max_model_len=hf.get("max_position_embeddings", 2048),
            rope_theta=float(theta),
            rope_scaling=rope_scaling,
            rms_norm_eps=hf.get("rms_norm_eps", 1e-5),
            qkv_bias=hf.get("attention_bias", hf.get("model_type") == "qwen2"),
            tie_word_embeddings=hf.get("tie_word_embeddings", False),
            eos_token_id=eos[0] if isinstance(eos, list) else eos,
            hf_dir=str(path),
        )


MODEL_PRESETS: dict[str, ModelConfig] = {name: ModelConfig(name, **shape) for name, shape in PRESET_SHAPES.items()}
