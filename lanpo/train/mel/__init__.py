"""MEL inside a training step (`method = "mel"`): meta-experiences from this rank's groups, and what the step's
transaction keeps of them. The pure parts (pairs, bifurcation, prompts, verdict) live in lanpo.mel."""
