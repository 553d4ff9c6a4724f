"""Embedded default models (random weights from a fixed seed; nothing downloaded)."""
