"""vLLM's offload flags: read by vLLM's rules into a plan, and a plan exported back to flags."""
