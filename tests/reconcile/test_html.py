"""The HTML report: self-contained, and its charts render in headless Chromium."""

from __future__ import annotations

import re
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

from payonce.reconcile.alerts import Thresholds, evaluate
from payonce.reconcile.html import render_html
from payonce.reconcile.run import reconcile
from tests.reconcile import data
from tests.support.apt import installed

_BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def chromium() -> str:
    """Chromium's path, installing Debian's package when it is missing (as root)."""
    return installed(_BROWSERS, "chromium", required=False)


@pytest.fixture
def page(tmp_path: Path) -> tuple[Path, str]:
    report = reconcile([data.payonce_calls(tmp_path)], [data.ledger_csv(tmp_path)])
    alerts = evaluate(report, Thresholds(max_duplicate_ratio=0.02))
    html = render_html(report, alerts)
    path = tmp_path / "report.html"
    path.write_text(html, encoding="utf-8")
    return path, html


def test_the_page_is_self_contained(page: tuple[Path, str]) -> None:
    _, html = page
    assert "<script" not in html
    assert "<link" not in html
    assert "url(" not in html
    # The only URL is the SVG namespace, which is a name, never fetched.
    assert set(re.findall(r"https?://[^\"' )]+", html)) == {"http://www.w3.org/2000/svg"}
    assert html.count("<svg") == 4  # spend per day, ratio by model, cost per call x2


def test_the_page_says_what_a_finance_reader_needs(page: tuple[Path, str]) -> None:
    _, html = page
    for text in (
        "Total spend",
        "$2.55",
        "Wasted on duplicates",
        "$0.65",
        "33.33%",
        "Cost per successful call",
        "$0.51",
        "Unmatched spend",
        "$0.40",
        "What these numbers mean",
        "Alert:",
        "2026-11-30",
        "2026-12-01",
        "r7",  # the outlier
        "r9",  # the unmatched line
    ):
        assert text in html, text


def _png_size(path: Path) -> tuple[int, int]:
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", header[16:24])
    return width, height


def _png_colors(path: Path) -> set[tuple[int, int, int]]:
    """The RGB colours of an 8-bit RGB or RGBA PNG (enough of a decoder for a screenshot)."""
    raw = path.read_bytes()
    position, idat, width, channels = 8, b"", 0, 3
    while position < len(raw):
        length, kind = struct.unpack(">I4s", raw[position : position + 8])
        body = raw[position + 8 : position + 8 + length]
        if kind == b"IHDR":
            width, _, depth, color = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and color in (2, 6)
            channels = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += body
        position += 12 + length
    pixels = zlib.decompress(idat)
    stride = width * channels
    previous = bytearray(stride)
    colors: set[tuple[int, int, int]] = set()
    for row in range(len(pixels) // (stride + 1)):
        kind = pixels[row * (stride + 1)]
        line = bytearray(pixels[row * (stride + 1) + 1 : (row + 1) * (stride + 1)])
        for i in range(stride):
            left = line[i - channels] if i >= channels else 0
            up = previous[i]
            corner = previous[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + left) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + up) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 0xFF
            elif kind == 4:
                estimate = left + up - corner
                pa, pb, pc = abs(estimate - left), abs(estimate - up), abs(estimate - corner)
                best = left if pa <= pb and pa <= pc else up if pb <= pc else corner
                line[i] = (line[i] + best) & 0xFF
        if row % 4 == 0:  # every fourth row is plenty to see the bars
            colors.update(
                (line[i], line[i + 1], line[i + 2]) for i in range(0, stride, channels * 2)
            )
        previous = line
    return colors


@pytest.mark.slow
def test_charts_render_in_headless_chromium(page: tuple[Path, str], tmp_path: Path) -> None:
    browser = chromium()
    path, _ = page
    shot = tmp_path / "shot.png"
    profile = tmp_path / "profile"
    done = subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            f"--screenshot={shot}",
            "--window-size=1200,2000",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            f"--user-data-dir={profile}",
            path.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert shot.exists()
    assert _png_size(shot) == (1200, 2000)
    # A blank page compresses to a few KiB; text, tables and charts do not.
    assert shot.stat().st_size > 50_000
    # The charts drew their bars: needed (blue), wasted (red), ratio (orange), cost (green).
    colors = _png_colors(shot)
    for name, rgb in {
        "needed": (0x4C, 0x78, 0xA8),
        "wasted": (0xE4, 0x57, 0x56),
        "ratio": (0xF5, 0x85, 0x18),
        "per call": (0x54, 0xA2, 0x4B),
    }.items():
        assert rgb in colors, name
