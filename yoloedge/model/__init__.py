"""What we know about a model before running it: tensor specs, metadata and class labels."""
