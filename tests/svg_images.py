"""Charts reach the page as ``<img src="data:image/svg+xml;base64,...">`` (shared notebooks
drop inline ``<svg>``); tests that look inside a chart read it back from the image.

:func:`inline_svg` puts each image's drawing back in its place, so an assertion on the
chart's elements (its ``<polyline>``, its bands, its labels) reads the drawing itself.
:func:`svg_images` lists the images, each decoded and checked to be a well-formed SVG
document of the size its ``<img>`` states.
"""

from __future__ import annotations

import base64
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass

_IMG = re.compile(r"<img\b[^>]*>")
_SRC = re.compile(r'src="data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)"')
_ATTR = re.compile(r'(\w[\w-]*)="([^"]*)"')
SVG_NS = "{http://www.w3.org/2000/svg}"


@dataclass
class SvgImage:
    svg: str  # the decoded drawing
    attrs: dict[str, str]  # the <img>'s attributes (src left out)


def _decode(tag: str) -> SvgImage | None:
    src = _SRC.search(tag)
    if src is None:
        return None
    svg = base64.b64decode(src.group(1)).decode("utf-8")
    root = ET.fromstring(svg)  # well-formed XML, or the test fails here
    assert root.tag == f"{SVG_NS}svg", root.tag
    attrs = {k: v for k, v in _ATTR.findall(tag) if k != "src"}
    assert root.get("width") == attrs.get("width") and root.get("height") == attrs.get("height")
    return SvgImage(svg, attrs)


def svg_images(html: str) -> list[SvgImage]:
    """Every chart image in ``html``, decoded (a non-SVG ``<img>`` fails the test)."""
    out = []
    for tag in _IMG.findall(html):
        image = _decode(tag)
        assert image is not None, f"an <img> that is no SVG data URI: {tag[:120]}"
        out.append(image)
    return out


def inline_svg(html: str) -> str:
    """``html`` with every chart image replaced by its drawing."""

    def put_back(m: re.Match[str]) -> str:
        image = _decode(m.group(0))
        assert image is not None, m.group(0)[:120]
        return image.svg

    return _IMG.sub(put_back, html)
