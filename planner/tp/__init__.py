"""Tensor parallel: one plan per rank (the spec split by shard rules and attention heads), written, shown and checked as a set."""
