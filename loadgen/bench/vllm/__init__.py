"""`speckv bench vllm`: SpeckvConnector on a real vLLM engine (CPU build, tiny random Llama)."""
