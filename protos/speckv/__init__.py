"""speckv: predictive speculative KV-cache replication for bursty LLM inference."""

__version__ = "0.1.0"
