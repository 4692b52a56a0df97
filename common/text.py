"""Text from outside (an endpoint's error, a model's output) made safe to show on a terminal.

An endpoint or a model can send anything: ANSI escape sequences that recolour, move the cursor,
retitle the window or clear the screen, a 100 KB error on one "line", carriage returns that
overwrite what was printed before. `printable` turns such text into one line of plain text:

- escape sequences are removed whole: CSI (`ESC [ ... final`), OSC (`ESC ] ... BEL or ESC \\`),
  DCS, SOS, PM and APC strings, the other ESC sequences, and their 8-bit (C1) forms;
- every other control character goes (C0, C1, DEL), and so do the bidirectional marks and overrides
  (U+202A-U+202E, U+2066-U+2069...) that make a terminal show text in another order than it is;
- line breaks of every kind (CR, LF, VT, FF, NEL, U+2028/2029) become one visible " | "; a tab
  becomes a space; a lone surrogate (a byte that was not UTF-8) becomes U+FFFD, so printing the
  result never fails on a UTF-8 terminal;
- the result is at most `limit` characters: a longer text is cut and ends with a note of how many
  characters were cut. Only the first `limit * 8 + 4096` characters are looked at, so a 100 MB
  error costs no more than a short one (the rest counts as cut).

Standard library only.
"""

from __future__ import annotations

import re

SEPARATOR = " | "
_WINDOW = 8  # characters looked at per character shown (escape sequences take room), plus 4096

# whole escape sequences: CSI; the string ones (OSC, DCS, SOS, PM, APC) up to their terminator, or to
# the end when it never comes (a terminal would swallow the rest as well); any other ESC sequence
_ESCAPES = re.compile(r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?"
                      r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
                      r"|\x1b[ -/]*[0-~]?")
_BREAKS = re.compile(r"[ \t]*(?:[\r\n\x0b\x0c\x85\u2028\u2029][ \t]*)+")
_DROPPED = re.compile(r"[\x00-\x08\x0e-\x1f\x7f-\x84\x86-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]+")
_SURROGATES = re.compile(r"[\ud800-\udfff]")


def printable(text: object, limit: int = 300) -> str:
    """`text` as one line of plain text of at most `limit` characters (see the module docstring);
    bytes are read as UTF-8 (a bad byte becomes U+FFFD), anything else through str()."""
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8", "replace")
    elif not isinstance(text, str):
        text = str(text)
    limit = max(int(limit), 1)
    window = text[:limit * _WINDOW + 4096]
    clean, unread = plain_line(window), len(text) - len(window)
    if len(clean) <= limit and not unread:
        return clean
    widest = f" ... [{len(clean) + unread} chars cut]"  # the note at its longest: what is kept fits with it
    keep = max(0, limit - len(widest))
    note = f" ... [{len(clean) - keep + unread} chars cut]"
    return (clean[:keep].rstrip() + note).lstrip()[:limit]


def plain_line(text: str) -> str:
    """`text` without escape sequences and control characters, its line breaks as " | " (not cut)."""
    text = _DROPPED.sub("", _ESCAPES.sub("", text))  # before the breaks: "a\n\x00\nb" is one break
    text = text.strip(" \t\r\n\x0b\x0c\x85\u2028\u2029")  # no separator at either end
    text = _BREAKS.sub(SEPARATOR, text).replace("\t", " ")
    return _SURROGATES.sub("\ufffd", text)
