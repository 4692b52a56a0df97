"""`printable`: text from outside shown as one line of plain text, bounded (issue 31, item 6)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.text import printable

CONTROLS = "".join(chr(c) for c in [*range(0x20), 0x7f, *range(0x80, 0xa0)])


@pytest.mark.parametrize("text, shown", [
    ("plain text", "plain text"),
    ("\x1b[31mred\x1b[0m and \x1b[1;4mbold\x1b[m", "red and bold"),  # SGR colours (CSI)
    ("\x1b[2J\x1b[Hcleared", "cleared"),  # clear the screen, cursor home
    ("\x1b]0;a new window title\x07after", "after"),  # OSC ended by BEL
    ("\x1b]8;;http://evil.example\x1b\\link\x1b]8;;\x1b\\", "link"),  # an OSC 8 hyperlink ended by ST
    ("\x1bP+q544e\x1b\\dcs", "dcs"),  # DCS string
    ("\x9b31mc1 csi\x9b0m", "c1 csi"),  # the 8-bit CSI
    ("\x9d0;title\x9cc1 osc", "c1 osc"),
    ("\x1b7saved\x1b8 \x1b(B\x1bc", "saved"),  # other ESC sequences (save/restore cursor, charset, reset)
    ("unterminated \x1b]0;the rest is a title", "unterminated"),  # a terminal would swallow the rest too
    ("bell\x07 nul\x00 del\x7f backspace\x08!", "bell nul del backspace!"),
    ("one\ntwo\r\nthree\rfour\x0bfive\x0csix\x85seven\u2028eight\u2029nine", "one | two | three | four | five | six | "
                                                                         "seven | eight | nine"),
    ("\n\n  lines  \n\n\n around \n\n", "lines | around"),  # runs of breaks are one separator; none at the ends
    ("a\n\x00\nb", "a | b"),
    ("tab\tseparated", "tab separated"),
    ("\u202eevil\u202c \u2066isolate\u2069 \u200fmark", "evil isolate mark"),  # bidi overrides and marks
    ("bad byte \udcff here", "bad byte \ufffd here"),  # a lone surrogate would make print() raise
    ("unicode stays: é 中文 🙂", "unicode stays: é 中文 🙂"),
])
def test_control_sequences_go_and_text_stays(text, shown):
    assert printable(text) == shown


def test_bytes_and_other_objects():
    assert printable(b"\xff\xfebytes \x1b[31mred") == "\ufffd\ufffdbytes red"
    assert printable(ValueError("bad\nvalue")) == "bad | value"
    assert printable(None) == "None"


def test_a_long_text_is_cut_with_a_note_of_how_much():
    shown = printable("x" * 1000, 60)
    assert len(shown) <= 60 and shown.startswith("x" * 30) and shown.endswith(" chars cut]")
    kept = shown.index(" ...")
    assert shown.endswith(f"[{1000 - kept} chars cut]")
    assert printable("y" * 60, 60) == "y" * 60  # exactly the limit: nothing cut


def test_100_kb_on_one_line_and_a_wall_of_escapes_are_bounded():
    """Only a window at the front is looked at: the rest counts as cut."""
    for text in ("A" * 100_000, "\x1b[2J" * 100_000 + "tail", "\x1b[31m" + "B" * 100_000 + "\n" * 100_000):
        shown = printable(text, 300)
        assert len(shown) <= 300 and "\x1b" not in shown and "\n" not in shown
        assert shown.endswith(" chars cut]")


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list(CONTROLS) + list("ab[];\\ \u202e\u2028") + ["\ud800", "é"]),
               max_size=400), st.integers(1, 200))
def test_no_control_character_ever_comes_out_and_the_length_is_bounded(text, limit):
    shown = printable(text, limit)
    assert len(shown) <= limit
    assert not set(shown) & set(CONTROLS + "\u202e\u2028\ud800")
    shown.encode("utf-8")  # never raises: no lone surrogate is left
