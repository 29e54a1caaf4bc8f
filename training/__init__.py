"""veil.training: produces models (ULD-Net polynomial networks today; adapters, optimizers, compression,
the ARPC codec and PriorGuide samplers as their issues land). The engine never imports this package."""
