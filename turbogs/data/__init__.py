"""Scenes in: COLMAP (binary and text) and transforms.json captures."""
