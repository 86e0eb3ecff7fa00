"""Rollouts: the engine interface and its engines (`hf`, `vllm`), the OpenAI-compatible client,
the multi-turn agent loop and the token-exact trajectory it produces."""
