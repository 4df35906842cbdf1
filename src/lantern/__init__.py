"""lantern-pipeline: relaxed speculative decoding for visual autoregressive image models."""

__version__ = "0.1.0"
