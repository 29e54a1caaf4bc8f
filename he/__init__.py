"""veil.he: CKKS parameters, keys, compiler and evaluation (TenSEAL). Never needs torch.

Filled by the encrypted-inference issue; nothing is here yet."""
