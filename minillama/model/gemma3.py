"""gemma3: placeholder until implemented."""
