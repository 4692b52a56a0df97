"""Tools: the tolerant call parser, execution under a timeout, validity counting, load_tool."""

from __future__ import annotations

import json
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from judges.types import ToolCallRecord
from marl.tools import ParsedCall, ToolRegistry, ToolSpec, load_tool


def get_weather(city: str, days: int = 1) -> dict:
    return {"city": city, "days": days, "sky": "sunny"}


def add(a: int, b: int) -> int:
    return a + b


def search(query: str) -> str:
    return f"results for {query}"


def set_flag(on: bool, level: float = 0.5, tags: list | None = None) -> str:
    return f"{on} {level} {tags}"


def boom(reason: str) -> str:
    raise KeyError(f"no such thing: {reason}")


SLOW_FINISHED = threading.Event()  # set when a slow() call has slept its whole time


def slow(seconds: float) -> str:
    time.sleep(seconds)
    SLOW_FINISHED.set()
    return "done"


def long_text(n: int) -> str:
    return "x" * n


def own_timeout() -> str:
    raise TimeoutError("upstream timed out")


def _obj(props: dict, required: list[str]) -> dict:
    return {"type": "object", "properties": props, "required": required}


SPECS = [
    ToolSpec("get_weather", get_weather, "Current weather for a city",
             _obj({"city": {"type": "string", "description": "city name"}, "days": {"type": "integer"}}, ["city"])),
    ToolSpec("add", add, "Add two integers", _obj({"a": {"type": "integer"}, "b": {"type": "integer"}}, ["a", "b"])),
    ToolSpec("web-search", search, "Search the web", _obj({"query": {"type": "string"}}, ["query"])),
    ToolSpec("set_flag", set_flag, "Set a flag", _obj({"on": {"type": "boolean"}, "level": {"type": "number"},
                                                       "tags": {"type": "array", "items": {"type": "string"}}},
                                                      ["on"])),
    ToolSpec("boom", boom, "Always fails", _obj({"reason": {"type": "string"}}, [])),
    ToolSpec("slow", slow, "Sleeps", _obj({"seconds": {"type": "number"}}, ["seconds"]), timeout_s=0.2),
    ToolSpec("long_text", long_text, "", _obj({"n": {"type": "integer"}}, ["n"])),
    ToolSpec("own_timeout", own_timeout, "", _obj({}, [])),
]


@pytest.fixture
def reg() -> ToolRegistry:
    return ToolRegistry(SPECS)


def one(reg: ToolRegistry, text: str) -> ParsedCall:
    calls = reg.parse(text)
    assert len(calls) == 1, calls
    return calls[0]


def args_of(reg: ToolRegistry, text: str) -> dict:
    call = one(reg, text)
    assert call.ok, call.error
    return call.arguments


# ---- registry --------------------------------------------------------------------------------------

def test_names_and_describe(reg):
    assert reg.names[:3] == ["get_weather", "add", "web-search"]
    lines = reg.describe().splitlines()
    assert lines[0] == "get_weather(city: string, days?: integer) - Current weather for a city"
    assert lines[6] == "long_text(n: integer)"
    enum = ToolSpec("unit", str, "Pick", _obj({"u": {"type": "string", "enum": ["c", "f"]}}, ["u"]))
    assert enum.usage() == 'unit(u: "c"|"f") - Pick'


def test_duplicate_and_bad_names_rejected():
    with pytest.raises(ValueError, match="duplicate"):
        ToolRegistry([ToolSpec("a_b", add), ToolSpec("A-B", add)])
    with pytest.raises(ValueError, match="identifier"):
        ToolSpec("not a name", add)
    with pytest.raises(ValueError, match="callable"):
        ToolSpec("x", "not callable")
    with pytest.raises(ValueError, match="required argument 'b' is not in"):
        ToolSpec("x", add, parameters=_obj({"a": {"type": "integer"}}, ["a", "b"]))
    with pytest.raises(ValueError, match="must map each argument name"):
        ToolSpec("x", add, parameters={"properties": ["a"]})


# ---- parser: well-formed calls ---------------------------------------------------------------------

@pytest.mark.parametrize("text", [
    '{"tool": "get_weather", "arguments": {"city": "Paris"}}',
    '{"name": "get_weather", "args": {"city": "Paris"}}',
    '{"function": "get_weather", "parameters": {"city": "Paris"}}',
    '{"tool": "get_weather", "input": {"city": "Paris"}}',
    "{'tool': 'get_weather', 'arguments': {'city': 'Paris',},}",
    '{tool: get_weather, arguments: {city: Paris}}',
    '{"tool": "get_weather", "city": "Paris"}',
    '{"tool": "get_weather", "arguments": "Paris"}',
    '{"type": "function", "function": {"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}}',
    '{"tool": "get_weather", "arguments": {"city": "Paris"}} and then some trailing garbage }}',
    'get_weather(city="Paris")',
    "get_weather(city='Paris')",
    "get_weather(Paris)",
    'get_weather("Paris")',
    "GET_WEATHER ( city = Paris )",
    "Get-Weather(city: Paris)",
    'get_weather({"city": "Paris"})',
    "functions.get_weather(city='Paris')",
    "CALL get_weather(city=Paris)",
    "call: get_weather(city=Paris)",
    '```json\n{"tool": "get_weather", "arguments": {"city": "Paris"}}\n```',
    "<tool>get_weather(city=\"Paris\")</tool>",
    '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>',
    "I think\n  get_weather( city = 'Paris' ,  )\nwill tell us.",
])
def test_accepted_formats(reg, text):
    call = one(reg, text)
    assert call.ok, call.error
    assert (call.name, call.arguments) == ("get_weather", {"city": "Paris"})


def test_values_are_parsed_and_coerced(reg):
    assert args_of(reg, "add(1, 2)") == {"a": 1, "b": 2}
    assert args_of(reg, 'add(a="12", b=3.0)') == {"a": 12, "b": 3}
    assert args_of(reg, '{"tool": "add", "arguments": {"a": "4", "b": -5}}') == {"a": 4, "b": -5}
    assert args_of(reg, "set_flag(on=true, level=1e-1)") == {"on": True, "level": 0.1}
    assert args_of(reg, "set_flag(True, 2)") == {"on": True, "level": 2}
    assert args_of(reg, "set_flag(on='yes', tags=[a, 'b'])") == {"on": True, "tags": ["a", "b"]}
    assert args_of(reg, 'set_flag(on=false, tags=\'["x"]\')') == {"on": False, "tags": ["x"]}
    # bare values keep their text for string parameters; literals for typed ones
    assert args_of(reg, "get_weather(007, 3)") == {"city": "007", "days": 3}
    assert args_of(reg, "get_weather(city=true)") == {"city": "true"}
    assert args_of(reg, "get_weather(city=12)") == {"city": "12"}
    assert args_of(reg, "get_weather(New York)") == {"city": "New York"}
    assert args_of(reg, "web_search(cats, dogs and mice)") == {"query": "cats, dogs and mice"}
    assert args_of(reg, "web-search(query=it's fine)") == {"query": "it's fine"}
    assert args_of(reg, r'web_search("say \"hi\"\n")') == {"query": 'say "hi"\n'}
    assert args_of(reg, r"web_search('it\'s')") == {"query": "it's"}
    assert args_of(reg, "boom()") == {}
    # an optional argument given as null falls back to the tool's default
    assert args_of(reg, "get_weather(Paris, days=null)") == {"city": "Paris"}
    assert args_of(reg, '{"tool": "get_weather", "arguments": {"city": "Paris", "days": null}}') == {"city": "Paris"}
    assert args_of(reg, "get_weather(city='None')") == {"city": "None"}


def test_names_are_canonical_and_prose_ignored(reg):
    assert one(reg, "WEB_SEARCH(query=x)").name == "web-search"
    assert reg.parse("Use print(x) or len(y); maybe foo(bar=1). get_weather is a tool.") == []
    assert reg.parse("I will call the weather service for Paris.") == []
    assert reg.parse('{"name": "Alice", "age": 3}') == []
    assert reg.parse("reget_weather(Paris) my_get_weather(Paris)") == []
    assert reg.parse("you could call print(x) here") == []  # only upper-case CALL marks an unknown name
    assert reg.parse('{"function": "sums numbers", "arguments": [1, 2]}') == []


def test_multiple_calls_in_order(reg):
    text = ('first add(1, 2) then {"tool": "get_weather", "arguments": {"city": "Oslo"}}\n'
            "and finally <tool>web_search(query=\"a, b\")</tool>")
    calls = reg.parse(text)
    assert [(c.name, c.arguments) for c in calls] == [
        ("add", {"a": 1, "b": 2}), ("get_weather", {"city": "Oslo"}), ("web-search", {"query": "a, b"})]
    assert all(c.ok for c in calls)
    assert calls[0].text == "add(1, 2)" and text[calls[0].start:calls[0].end] == calls[0].text


def test_nested_structures_and_unicode(reg):
    call = one(reg, 'set_flag(on=1, tags=["a(b)", "{c}", "d,e"])')
    assert call.ok, call.error
    assert call.arguments == {"on": True, "tags": ["a(b)", "{c}", "d,e"]}
    assert one(reg, "get_weather(city='Zürich 東京 🌧')").arguments == {"city": "Zürich 東京 🌧"}
    outer = '{"tool_calls": [{"function": {"name": "add", "arguments": "{\\"a\\": 1, \\"b\\": 2}"}}]}'
    assert one(reg, outer).arguments == {"a": 1, "b": 2}
    # a call written inside another call's string argument is data, not a second call
    assert one(reg, '{"tool": "web_search", "arguments": {"query": "add(1, 2)"}}').arguments == {"query": "add(1, 2)"}


def test_max_calls(reg):
    assert len(reg.parse("boom() " * 50)) == 8
    assert len(ToolRegistry(SPECS, max_calls=2).parse("boom() " * 5)) == 2


# ---- parser: malformed calls -----------------------------------------------------------------------

@pytest.mark.parametrize("text, name, fragment", [
    ("get_weather(city='Paris'", "get_weather", "unbalanced"),
    ("get_weather(city='Paris]", "get_weather", "unterminated string"),
    ("get_weather(city=[1, 2)", "get_weather", "mismatched"),
    ('get_weather(city="Paris" "Lyon")', "get_weather", "after string"),
    ("get_weather(town=Paris)", "get_weather", "unknown argument 'town'"),
    ("get_weather()", "get_weather", "missing required argument(s): city"),
    ("get_weather(days=2)", "get_weather", "missing required"),
    ("get_weather(Paris, 2, 3)", "get_weather", "takes 2 argument(s)"),
    ("get_weather(city=Paris, Lyon)", "get_weather", "positional argument after keyword"),
    ("get_weather(Paris, city=Lyon)", "get_weather", "given twice"),
    ("get_weather(city=, days=1)", "get_weather", "empty argument"),
    ("add(a=1.5, b=2)", "add", "expected integer"),
    ("add(a=one, b=2)", "add", "expected integer"),
    ('add(a={"x": 1, b=2)', "add", "mismatched"),
    ("add(a=" + "[" * 1900 + "]" * 1900 + ", b=1)", "add", "nested too deeply"),
    ('{"tool": "add", "arguments": ' + "[" * 1900 + "]" * 1900 + "}", "add", "nested too deeply"),
    ("set_flag(on=maybe)", "set_flag", "expected boolean"),
    ('{"tool": "get_weather", "arguments": {"city": null}}', "get_weather", "expected string"),
    ('{"tool": "get_weather", "arguments": {"city": ["Paris"]}}', "get_weather", "expected string"),
    ('{"tool": "get_weather", "arguments": {"city": "Paris"}', "get_weather", "broken JSON"),
    ('{"tool": "get_weather", "arguments": {"city": "Paris" "Lyon"}}', "get_weather", "not valid JSON"),
    ('{"tool": "get_weather", "arguments": "{\\"city\\": }"}', "get_weather", "not valid JSON"),
    ('{"tool": "get_wether", "arguments": {"city": "Paris"}}', "get_wether", "unknown tool 'get_wether'"),
    ("CALL get_wether(city=Paris)", "get_wether", "unknown tool"),
    ("<tool>fetch(url=x)</tool>", "fetch", "unknown tool"),
])
def test_malformed_calls_are_invalid_calls(reg, text, name, fragment):
    call = one(reg, text)
    assert not call.ok and call.name == name
    assert fragment in call.error


def test_broken_call_does_not_hide_later_calls(reg):
    calls = reg.parse('{"tool": "add", "arguments": {"a": 1\nthen add(2, 3)')
    assert [c.ok for c in calls] == [False, True] and calls[1].arguments == {"a": 2, "b": 3}


@pytest.mark.parametrize("text", ["", "   ", "(", ")", "{", "}", "{}", "[]", '"', "'", "()()", "{{{{", "add",
                                  "add(", "((((add", "add(((((", "{'tool': ", '{"tool": "add"', "\x00\uffff",
                                  "add(a='", "add(a=\"\\", "{tool: {tool: {tool:"])
def test_degenerate_inputs_never_raise(reg, text):
    for call in reg.parse(text):
        assert call.name == "add" and not call.ok


def test_non_string_and_empty_registry():
    assert ToolRegistry(SPECS).parse(None) == []
    assert ToolRegistry([]).parse("add(1, 2)") == []


def test_huge_inputs_are_fast_and_safe(reg):
    started = time.perf_counter()
    prose = "lorem ipsum (dolor) {sit} 'amet' " * 30_000
    assert [c.arguments for c in reg.parse("add(1, 2) " + prose)] == [{"a": 1, "b": 2}]
    reg.parse("{" * 200_000)
    reg.parse("(" * 200_000)
    reg.parse('{"tool": ' * 20_000)
    reg.parse("add(" * 20_000)
    reg.parse("get_weather(city='" + "x" * 100_000)
    assert len(reg.parse("add(1,2)" * 10_000)) == 8
    assert time.perf_counter() - started < 5  # generous: guards against quadratic blow-ups only


FRAGMENTS = ["add", "get_weather", "web-search", "(", ")", "{", "}", "[", "]", '"', "'", ",", "=", ":", " ",
             "\n", "1", "x", "tool", "arguments", "CALL ", "<tool>", "</tool>", "\\", "true", "None", "é"]


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=200), st.lists(st.sampled_from(FRAGMENTS), max_size=60).map("".join)))
def test_parser_never_raises_on_random_text(text):
    reg = ToolRegistry(SPECS)
    for call in reg.parse(text):
        assert isinstance(call, ParsedCall)
        assert call.error or reg.get(call.name) is not None
        assert 0 <= call.start <= call.end <= len(text)


# ---- execution -------------------------------------------------------------------------------------

def test_ok_call_and_dict_result_is_json(reg):
    [record] = reg.run_all("alice", "get_weather(Paris, days=2)")
    assert record == ToolCallRecord("alice", "get_weather", {"city": "Paris", "days": 2}, True,
                                    json.dumps({"city": "Paris", "days": 2, "sky": "sunny"}))
    assert reg.run_all("alice", "add(2, 3)")[0].result == "5"


def test_raising_tool_becomes_error_record(reg):
    [record] = reg.run_all("bob", "boom(reason=x)")
    assert not record.ok and record.result == "error: KeyError: 'no such thing: x'"
    [record] = reg.run_all("bob", "own_timeout()")
    assert record.result == "error: TimeoutError: upstream timed out"


def test_slow_tool_times_out(reg):
    SLOW_FINISHED.clear()
    [record] = reg.run_all("carol", "slow(5)")
    assert not SLOW_FINISHED.is_set()  # the call came back while the tool was still sleeping
    assert not record.ok and record.result.startswith("error: TimeoutError: slow did not finish within 0.2 s")
    assert reg.run_all("carol", "slow(0)")[0].result == "done"


def test_long_result_is_clipped(reg):
    record = reg.run_all("dan", "long_text(5000)")[0]
    assert record.ok and len(record.result) == 2000 and record.result.endswith("[clipped 3000 chars]")
    small = ToolRegistry(SPECS, max_result_chars=10)
    assert small.run_all("dan", "long_text(10)")[0].result == "x" * 10
    assert len(small.run_all("dan", "long_text(11)")[0].result) == 10


def test_invalid_call_record_explains_usage(reg):
    [record] = reg.run_all("erin", "get_weather(town=Paris)")
    assert record.ok is False and record.name == "get_weather" and record.arguments == {"town": "Paris"}
    assert record.result.startswith("error: invalid call: unknown argument 'town'")
    assert record.result.endswith("usage: get_weather(city: string, days?: integer)")


def test_call_validates_hand_made_calls(reg):
    assert reg.call("f", ParsedCall("ADD", {"a": "1", "b": 2})).result == "3"
    assert not reg.call("f", ParsedCall("add", {"a": 1})).ok
    assert reg.call("f", ParsedCall("nope", {})).result.startswith("error: invalid call: unknown tool 'nope'")


def test_unconvertible_result_never_raises():
    class Weird:
        def __str__(self):
            raise RuntimeError("no text")

    reg = ToolRegistry([ToolSpec("weird", lambda: Weird())])
    record = reg.run_all("g", "weird()")[0]
    assert not record.ok and record.result == "error: RuntimeError: no text"


def test_tool_without_timeout_runs_inline():
    seen = []
    reg = ToolRegistry([ToolSpec("where", lambda: seen.append(threading.current_thread()) or "ok", timeout_s=None)])
    assert reg.run_all("h", "where()")[0].ok and seen == [threading.current_thread()]


# ---- validity counting -----------------------------------------------------------------------------

def test_validity_is_counted_per_agent(reg):
    assert reg.stats("alice") == {"calls": 0, "valid": 0, "invalid": 0, "failed": 0}
    assert reg.validity("alice") is None
    reg.run_all("alice", "add(1, 2) add(1) get_weather(Paris) boom()")
    reg.run_all("bob", "get_weather(")
    assert reg.stats("alice") == {"calls": 4, "valid": 3, "invalid": 1, "failed": 1}
    assert reg.validity("alice") == 0.75
    assert reg.stats("bob") == {"calls": 1, "valid": 0, "invalid": 1, "failed": 0} and reg.validity("bob") == 0.0
    reg.run_all("alice", "no calls in this text")
    assert reg.stats("alice")["calls"] == 4
    reg.reset_stats()
    assert reg.validity("alice") is None


# ---- load_tool -------------------------------------------------------------------------------------

def test_load_tool_from_a_file(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "helper_mod_for_tools.py").write_text("SCALE = 3\n")
    (tmp_path / "pkg" / "weather.py").write_text(
        "from helper_mod_for_tools import SCALE\n\ndef get(city):\n    return city * SCALE\n\n"
        "class Box:\n    @staticmethod\n    def size():\n        return 7\n")
    fn = load_tool("pkg.weather:get", tmp_path)
    assert fn("a") == "aaa"
    assert load_tool("pkg.weather:get", str(tmp_path)) is fn  # imported once, under a unique name
    assert load_tool("pkg.weather:Box.size", tmp_path)() == 7
    assert fn.__module__.startswith("_marl_tool_pkg_weather_")
    assert str(tmp_path) not in __import__("sys").path


def test_load_tool_by_normal_import():
    assert load_tool("json:dumps") is json.dumps
    assert load_tool("os.path:join", None) is __import__("os").path.join


@pytest.mark.parametrize("ref, message", [
    ("json", "is not a 'module:function' reference"),
    (":dumps", "is not a 'module:function' reference"),
    ("no_such_module_xyz.sub:fn", "module no_such_module_xyz.sub not found (looked in"),
    ("json:no_such_function", "module json has no attribute no_such_function"),
    ("json:__doc__", "is not callable"),
])
def test_load_tool_failures_are_clear(tmp_path, ref, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        load_tool(ref, tmp_path)


def test_load_tool_reports_broken_files(tmp_path):
    (tmp_path / "broken.py").write_text("def f(:\n")
    with pytest.raises(ValueError, match=r"cannot import 'broken:f': loading .*broken.py raised SyntaxError"):
        load_tool("broken:f", tmp_path)
    (tmp_path / "needs.py").write_text("import no_such_dependency_xyz\n")
    with pytest.raises(ValueError, match="ModuleNotFoundError"):
        load_tool("needs:f", tmp_path)
    with pytest.raises(ValueError, match=f"looked in {tmp_path} and sys.path"):
        load_tool("absent_here:f", tmp_path)
