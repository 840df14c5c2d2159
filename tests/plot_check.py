#!/usr/bin/env python3
"""Checks a picture written by `ember ... --plot` (tests/test_tool_plot.c runs it).

usage: plot_check.py FILE WIDTH HEIGHT [--present RRGGBB,...] [--absent RRGGBB,...]

PNG: the signature, every chunk's CRC, IHDR's width and height, and the image data decoded
(zlib, then the five row filters undone) into exactly WIDTH x HEIGHT pixels; a present
colour must cover at least MIN_PIXELS pixels exactly (more than a legend's short line
alone: the series itself is drawn), an absent one none.
SVG: parsed as XML, an <svg> root with width/height WIDTHpt/HEIGHTpt; a present colour must
be the stroke of at least two paths (the series and its legend line), an absent one of none.
Exit 0 when every check holds, else 1 with what failed. Python's standard library only."""
import re
import struct
import sys
import xml.etree.ElementTree as ET
import zlib

MIN_PIXELS = 60  # a legend line alone covers at most about 40


def fail(msg):
    print(f"plot_check: {sys.argv[1]}: {msg}")
    sys.exit(1)


def png_pixels(data, width, height):
    """Returns {(r, g, b): count} over the decoded image."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        fail("not a PNG (bad signature)")
    pos, idat, ihdr, ended = 8, [], None, False
    while pos + 12 <= len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        if zlib.crc32(kind + body) != crc:
            fail(f"chunk {kind!r}: bad CRC")
        if kind == b"IHDR":
            ihdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            ended = True
            break
        pos += 12 + length
    if not ihdr or not ended:
        fail("no IHDR or no IEND chunk")
    w, h, depth, colour, _, _, interlace = ihdr
    if (w, h) != (width, height):
        fail(f"IHDR says {w}x{h}, expected {width}x{height}")
    if depth != 8 or colour not in (2, 6) or interlace != 0:
        fail(f"unexpected format: depth {depth}, colour type {colour}, interlace {interlace}")
    bpp = 3 if colour == 2 else 4
    raw = zlib.decompress(b"".join(idat))
    stride = w * bpp
    if len(raw) != h * (stride + 1):
        fail(f"{len(raw)} bytes of image data, expected {h * (stride + 1)}")
    prev = bytearray(stride)
    counts = {}
    for y in range(h):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        if f == 1:
            for i in range(bpp, stride):
                line[i] = (line[i] + line[i - bpp]) & 255
        elif f == 2:
            for i in range(stride):
                line[i] = (line[i] + prev[i]) & 255
        elif f == 3:
            for i in range(stride):
                left = line[i - bpp] if i >= bpp else 0
                line[i] = (line[i] + ((left + prev[i]) >> 1)) & 255
        elif f == 4:
            for i in range(stride):
                a = line[i - bpp] if i >= bpp else 0
                b = prev[i]
                c = prev[i - bpp] if i >= bpp else 0
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        elif f != 0:
            fail(f"row {y}: unknown filter {f}")
        for x in range(0, stride, bpp):
            key = (line[x], line[x + 1], line[x + 2])
            counts[key] = counts.get(key, 0) + 1
        prev = line
    return counts


def svg_strokes(data, width, height):
    try:
        root = ET.fromstring(data)
    except ET.ParseError as e:
        fail(f"not well-formed XML: {e}")
    if root.tag != "{http://www.w3.org/2000/svg}svg":
        fail(f"the root element is {root.tag}, not svg")
    for attr, want in (("width", width), ("height", height)):
        got = root.get(attr, "")
        if got not in (f"{want}pt", f"{want}", f"{want}px"):
            fail(f"{attr}='{got}', expected {want}pt")
    strokes = {}
    for el in root.iter():
        m = re.search(r"stroke:rgb\(([\d.]+)%,([\d.]+)%,([\d.]+)%\)", el.get("style", ""))
        if m:
            key = tuple(round(float(v) * 255 / 100) for v in m.groups())
            strokes[key] = strokes.get(key, 0) + 1
    return strokes


def colours(arg):
    return [(int(c[0:2], 16), int(c[2:4], 16), int(c[4:6], 16)) for c in arg.split(",") if c]


def main():
    if len(sys.argv) < 4:
        print(__doc__)
        sys.exit(2)
    path, width, height = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    present, absent = [], []
    args = sys.argv[4:]
    for flag, value in zip(args[::2], args[1::2]):
        (present if flag == "--present" else absent).extend(colours(value))
    data = open(path, "rb").read()
    svg = path.lower().endswith(".svg")
    found = svg_strokes(data, width, height) if svg else png_pixels(data, width, height)
    need = 2 if svg else MIN_PIXELS
    what = "paths stroked" if svg else "pixels"
    for c in present:
        if found.get(c, 0) < need:
            fail("colour #%02x%02x%02x: %d %s, expected at least %d (the series is missing)" % (*c, found.get(c, 0), what, need))
    for c in absent:
        if found.get(c, 0):
            fail("colour #%02x%02x%02x: %d %s, expected none (a series that should be absent)" % (*c, found[c], what))
    print(f"plot_check: {path}: {width}x{height}, {len(present)} series present, {len(absent)} absent: ok")


main()
