"""PriorGuide training side: simulators with known answers and the amortized diffusion posterior."""
