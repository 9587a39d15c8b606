"""What a model is, without its weights: the normalised ModelSpec, how it is read from an HF config.json, and
the named preset configs. No module here builds a tensor, so the simulator and the cache planner read the
same geometry as the models without loading them."""
