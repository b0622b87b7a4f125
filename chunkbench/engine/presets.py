"""Model presets: the shapes of real architectures (from each model's published config.json) and two small
ones for tests and CPU benchmarks. Shapes, not weights, are what performance depends on."""

from __future__ import annotations

PRESET_SHAPES: dict[str, dict] = {  # name -> ModelConfig's fields (engine/model_config.MODEL_PRESETS)
    # For tests: ~1.8M parameters.
    "tiny": dict(vocab_size=4096, hidden_size=128, intermediate_size=384, num_layers=4,
                 num_heads=4, num_kv_heads=2, head_dim=32, max_model_len=2048),
    # For CPU benchmarks: ~100M parameters, Llama proportions.
    "small": dict(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_layers=12,
                  num_heads=12, num_kv_heads=4, head_dim=64, max_model_len=8192,
                  tie_word_embeddings=True),
    # Real architectures, numbers from each model's published config.json.
    "llama-3.2-1b": dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                         num_layers=16, num_heads=32, num_kv_heads=8, head_dim=64,
                         max_model_len=131072, rope_theta=500000.0,
                         rope_scaling=(32.0, 1.0, 4.0, 8192), tie_word_embeddings=True),
    "llama-3-8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                       num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128, max_model_len=8192,
                       rope_theta=500000.0),
    "llama-3-70b": dict(vocab_size=128256, hidden_size=8192, intermediate_size=28672,
                        num_layers=80, num_heads=64, num_kv_heads=8, head_dim=128, max_model_len=8192,
                        rope_theta=500000.0),
    # Llama 3.1 (Meta's config.json): 128k context through llama3 RoPE scaling of the 8k original.
    "llama-3.1-8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                         num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128, max_model_len=131072,
                         rope_theta=500000.0, rope_scaling=(8.0, 1.0, 4.0, 8192)),
    "llama-3.1-70b": dict(vocab_size=128256, hidden_size=8192, intermediate_size=28672,
                          num_layers=80, num_heads=64, num_kv_heads=8, head_dim=128, max_model_len=131072,
                          rope_theta=500000.0, rope_scaling=(8.0, 1.0, 4.0, 8192)),
    "mistral-7b": dict(vocab_size=32768, hidden_size=4096, intermediate_size=14336,
                       num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128, max_model_len=32768,
                       rope_theta=1000000.0),
    "qwen2.5-7b": dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944,
                       num_layers=28, num_heads=28, num_kv_heads=4, head_dim=128, max_model_len=32768,
                       rope_theta=1000000.0, rms_norm_eps=1e-6, qkv_bias=True),
    # Qwen2.5 32B and 72B (Qwen's config.json): 32768 native context (131072 only with YaRN, not modelled).
    "qwen2.5-32b": dict(vocab_size=152064, hidden_size=5120, intermediate_size=27648,
                        num_layers=64, num_heads=40, num_kv_heads=8, head_dim=128, max_model_len=32768,
                        rope_theta=1000000.0, rms_norm_eps=1e-6, qkv_bias=True),
    "qwen2.5-72b": dict(vocab_size=152064, hidden_size=8192, intermediate_size=29568,
                        num_layers=80, num_heads=64, num_kv_heads=8, head_dim=128, max_model_len=32768,
                        rope_theta=1000000.0, rms_norm_eps=1e-6, qkv_bias=True),
}
