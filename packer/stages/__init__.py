"""The build's stages as plain functions over tasks, so any engine can run them."""
