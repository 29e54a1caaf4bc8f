"""veil.codec: the ARPC codec's format and coding, shared by training and the engine (no torch).

Bitstreams (header, per-scale chunks, CRC), range coding of bits with constriction, image checks,
metrics and the classical (Pillow) baselines.
"""
