"""Rendering: mime bundles (text/plain + text/html), SVG charts, the live view."""
