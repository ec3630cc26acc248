"""Where specs come from besides hand-written files: checkpoint headers, Hugging Face configs."""
