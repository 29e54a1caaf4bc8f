"""veil.training.compress: SAES-SVD low-rank factorisation, HEAPr atomic-expert pruning and one-example safety
realignment behind one recipe API (docs/compress.md)."""
