"""Renderers: each takes a Report and returns text. None of them reads /proc."""
