"""Reading files a user names (common.files): real hostile files, each a one-line FileProblem naming the file.

A FIFO is read in a fresh interpreter: were the reader ever to block on it, the test would fail on the
subprocess's generous timeout instead of hanging the suite (the assertion is on what the reader says).
"""

import json
import os
import subprocess
import sys

import pytest

from common.files import (MAX_INT_DIGITS, MAX_JSON_DEPTH, FileProblem, FileTooLarge, decode_utf8, parse_json_line,
                          read_json_objects, read_user_file, read_user_head, read_user_text, text_lines,
                          user_file_problem)
from helpers.paths import ROOT


def _in_fresh_interpreter(code: str) -> str:
    """What `code` prints, run by a new interpreter at the repository root (a hang fails, never blocks)."""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    return result.stdout.strip()


def test_a_fifo_is_refused_unopened(tmp_path):
    fifo = tmp_path / "items.jsonl"
    os.mkfifo(fifo)
    said = _in_fresh_interpreter(f"from common.files import FileProblem, read_user_file\n"
                                 f"try:\n    read_user_file({str(fifo)!r})\nexcept FileProblem as p:\n    print(p)")
    assert said == f"{fifo}: is a named pipe (FIFO), not a regular file (reading one waits for a writer that may " \
                   "never come); give a regular file"


def test_a_fifo_swapped_in_after_the_check_is_refused_by_fstat_without_waiting(tmp_path):
    """The path passes os.stat as a regular file, then is a FIFO when opened: the non-blocking open returns
    at once with no writer, and fstat of the open file refuses it."""
    fifo = tmp_path / "pairs.jsonl"
    os.mkfifo(fifo)
    said = _in_fresh_interpreter(f"import common.files as files\n"
                                 f"files.user_file_problem = lambda path, expected: None  # the check passed\n"
                                 f"try:\n    files.read_user_file({str(fifo)!r})\nexcept files.FileProblem as p:\n"
                                 f"    print(p)")
    assert said.startswith(f"{fifo}: is a named pipe (FIFO), not a regular file")


@pytest.mark.parametrize("path", ["/dev/zero", "/dev/null"])
def test_a_device_is_refused_unopened(path):
    words = "is a character device, not a regular file (a device such as /dev/zero never ends)"
    with pytest.raises(FileProblem) as caught:
        read_user_file(path, expected="a JSON-lines file")
    assert str(caught.value) == f"{path}: {words}; give a JSON-lines file"


def test_a_folder_a_missing_file_and_a_socket_are_one_line_each(tmp_path):
    with pytest.raises(FileProblem, match=r"is a folder, not a regular file; give a tasks file$"):
        read_user_text(tmp_path, expected="a tasks file")
    with pytest.raises(FileProblem, match=r"nothing\.jsonl: cannot be read: no such file; check the path"):
        read_user_text(tmp_path / "nothing.jsonl")
    import socket

    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(tmp_path / "s"))
        assert user_file_problem(tmp_path / "s").startswith("is a socket, not a regular file")


def test_an_unreadable_file_says_permission_denied(tmp_path, monkeypatch):
    path = tmp_path / "pairs.jsonl"
    path.write_text("{}\n")
    path.chmod(0)
    if os.access(path, os.R_OK):  # root reads a file of mode 000: make the open fail as it would for a user
        def denied(*args, **kwargs):
            raise PermissionError(13, "Permission denied")

        monkeypatch.setattr(os, "open", denied)
    with pytest.raises(FileProblem) as caught:
        read_user_file(path)
    assert str(caught.value) == f"{path}: cannot be read: permission denied; make it readable (chmod u+r) or " \
                                "give another file"


def test_a_file_over_its_size_bound_is_refused_unread(tmp_path):
    path = tmp_path / "big.jsonl"
    path.write_bytes(b"x" * 101)
    with pytest.raises(FileTooLarge) as caught:
        read_user_file(path, max_bytes=100)
    assert (caught.value.size, caught.value.limit, caught.value.exact) == (101, 100, True)
    assert str(caught.value) == f"{path}: is 101 bytes, over the limit of 100 bytes for this file; give a smaller one"
    assert read_user_file(path, max_bytes=101) == b"x" * 101


def test_a_file_whose_size_says_zero_is_still_bounded_as_it_is_read():
    """/proc files report st_size 0: the read itself stops one byte past the bound."""
    with pytest.raises(FileTooLarge, match="is more than 10 bytes, over the limit of 10 bytes"):
        read_user_file("/proc/self/status", max_bytes=10)


def test_the_head_of_a_file_is_its_first_bytes_and_a_fifo_is_refused(tmp_path):
    path = tmp_path / "data.sqlite"
    path.write_bytes(b"SQLite format 3\x00rest")
    assert read_user_head(path, 16) == b"SQLite format 3\x00"
    with pytest.raises(FileProblem, match="character device"):
        read_user_head("/dev/zero", 16)


def test_text_that_is_not_utf8_names_the_line_and_column_of_the_bad_byte(tmp_path):
    path = tmp_path / "items.jsonl"
    path.write_bytes(b'{"a": 1}\n{"b": "caf\xe9"}\n')
    with pytest.raises(FileProblem) as caught:
        read_user_text(path)
    assert str(caught.value) == f"{path}:2: not UTF-8 text (byte 0xe9 at column 11; perhaps latin-1 or cp1252): " \
                                "save the file as UTF-8"
    assert (caught.value.line, caught.value.column) == (2, 11)
    with pytest.raises(FileProblem, match=": is UTF-16 text; save it as UTF-8"):
        decode_utf8('{"a": 1}'.encode("utf-16"), "f")
    assert decode_utf8("\ufeff{}".encode(), "f") == "{}"  # a byte-order mark of UTF-8 itself is dropped


def test_lines_split_at_newlines_only():
    text = '{"a": "x\u2028y"}\r\n\n   \n{"b": 2}'
    assert list(text_lines(text)) == [(1, '{"a": "x\u2028y"}'), (4, '{"b": 2}')]


@pytest.mark.parametrize("line, reason", [
    ("[" * 100_000 + "]" * 100_000, f"JSON nested more than {MAX_JSON_DEPTH} levels deep; flatten it"),
    ("[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1), f"JSON nested more than {MAX_JSON_DEPTH} levels"),
    ('{"n": ' + "9" * 5000 + "}", "an integer of 5,000 digits (at most 4,300 are read); no value needs that many: "
                                  "write it as a string if it is text (column 7)"),
    ('{"n": -' + "1" * 4301 + "}", "an integer of 4,301 digits"),
    ('{"n": NaN}', "NaN is not a JSON number (JSON has no NaN or Infinity); write a number or null (column 7)"),
    ('{"n": -Infinity}', "-Infinity is not a JSON number"),
    ('{"n": 1' + "0" * 400 + ".5}", "the number 10000000000000000000... is too large for a float"),
    ("{oops", "not valid JSON (Expecting property name enclosed in double quotes at column 2)"),
])
def test_a_hostile_json_line_is_one_located_problem(line, reason):
    with pytest.raises(FileProblem) as caught:
        parse_json_line("items.jsonl", 7, line)
    assert str(caught.value).startswith(f"items.jsonl:7: {reason}"), str(caught.value)
    assert "\n" not in str(caught.value)


def test_the_bounds_of_json_values_leave_sound_data_alone():
    deep = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    assert parse_json_line("f", 1, deep) is not None
    assert parse_json_line("f", 1, '{"n": ' + "9" * MAX_INT_DIGITS + "}")["n"] == 10 ** MAX_INT_DIGITS - 1
    assert parse_json_line("f", 1, '{"x": 1.5e300, "s": "' + "9" * 10_000 + '"}')["x"] == 1.5e300


def test_a_lower_interpreter_digit_limit_is_honoured_as_a_problem(monkeypatch):
    monkeypatch.setattr(sys, "get_int_max_str_digits", lambda: 640)
    with pytest.raises(FileProblem, match=r"f:1: an integer of 700 digits \(at most 640 are read\)"):
        parse_json_line("f", 1, "[" + "7" * 700 + "]")


def test_a_whole_json_file_names_the_line_of_its_problem():
    text = '{\n  "a": 1,\n  "b": ' + "9" * 5000 + "\n}"
    with pytest.raises(FileProblem, match=r"^cal\.json:3: an integer of 5,000 digits .*\(column 8\)$"):
        parse_json_line("cal.json", 1, text)
    with pytest.raises(FileProblem, match=r"^cal\.json:2: not valid JSON"):
        parse_json_line("cal.json", 1, '{\n  "a": oops}')


def test_json_objects_of_a_file_with_their_line_numbers(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps({"a": 1}) + "\n\n" + json.dumps({"b": [2]}) + "\n")
    assert read_json_objects(path) == [(1, {"a": 1}), (3, {"b": [2]})]
    path.write_text('{"a": 1}\n["p", "a", "b"]\n')
    with pytest.raises(FileProblem, match=r"pairs\.jsonl:2: expected a JSON object with prompt, got an array$"):
        read_json_objects(path, what="with prompt")


def test_a_path_with_a_nul_byte_is_a_problem_not_a_value_error():
    """YAML's "\\0" escape puts a NUL into a path a scenario names; os.stat raises ValueError on it."""
    assert user_file_problem("tasks\0.jsonl", "a tasks file") == "cannot be read: the path holds a NUL byte, which " \
                                                                  "no file name can; give a tasks file"
    with pytest.raises(FileProblem, match="holds a NUL byte"):
        read_user_file("x\0y")
