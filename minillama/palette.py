"""minillama.palette: the colours tokens are shown in (the Tiktokenizer page's pastels), shared by the
terminal (`minillama tokenize`) and the server's token playground, so both colour a text alike."""

from __future__ import annotations

__all__ = ["PALETTE", "FOREGROUND", "NEWLINE_MARK"]

# Pastel backgrounds in the spirit of the Tiktokenizer page (Tailwind's *-200 shades), cycled per token.
PALETTE: tuple[tuple[int, int, int], ...] = (
    (0xBA, 0xE6, 0xFD),  # sky
    (0xFD, 0xE6, 0x8A),  # amber
    (0xBB, 0xF7, 0xD0),  # green
    (0xFE, 0xCD, 0xD3),  # rose
    (0xC7, 0xD2, 0xFE),  # indigo
    (0xD9, 0xF9, 0x9D),  # lime
    (0xFE, 0xD7, 0xAA),  # orange
    (0xA5, 0xF3, 0xFC),  # cyan
    (0xE9, 0xD5, 0xFF),  # purple
    (0xFE, 0xF0, 0x8A),  # yellow
    (0x99, 0xF6, 0xE4),  # teal
    (0xFB, 0xCF, 0xE8),  # pink
)

FOREGROUND = (0x11, 0x18, 0x27)  # near-black, readable on every pastel
NEWLINE_MARK = "\u21b5"  # ↵: a newline inside a token gets a visible block before the line break
