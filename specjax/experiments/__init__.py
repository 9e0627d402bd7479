"""Importable logic of the launchers in the top-level `experiments/` folder."""
