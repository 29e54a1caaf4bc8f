"""ARPC codec training: multi-scale bitwise residual tokenizer, next-scale prior, trainer."""
