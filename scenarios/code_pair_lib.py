"""Tasks, expert and the tester's scorer of the code_pair scenario.

Each task is a small Python function: a signature, a one-line spec, visible examples (in the prompt)
and hidden tests (in metadata["tests"], the `{"call", "expected"}` format of judges.code). Expected
values are computed once from the reference solution (trusted code, run here, never in the prompt).
"""

from __future__ import annotations

import random
import re

# (entry, signature, spec, visible example calls, hidden test calls, reference solution)
FUNCTIONS: list[tuple[str, str, str, list[str], list[str], str]] = [
    ("add_numbers", "add_numbers(a: int, b: int) -> int", "Return the sum of a and b.",
     ["add_numbers(2, 3)"], ["add_numbers(0, 0)", "add_numbers(-4, 9)", "add_numbers(123, 877)"],
     "def add_numbers(a, b):\n    return a + b\n"),
    ("reverse_string", "reverse_string(s: str) -> str", "Return s reversed.",
     ["reverse_string('abc')"], ["reverse_string('')", "reverse_string('racecar')", "reverse_string('Hello, world')"],
     "def reverse_string(s):\n    return s[::-1]\n"),
    ("is_palindrome", "is_palindrome(s: str) -> bool",
     "True when s reads the same backwards, ignoring case and non-alphanumeric characters.",
     ["is_palindrome('Abba')"],
     ["is_palindrome('A man, a plan, a canal: Panama')", "is_palindrome('abc')", "is_palindrome('')",
      "is_palindrome('No lemon, no melon')"],
     "def is_palindrome(s):\n    t = [c.lower() for c in s if c.isalnum()]\n    return t == t[::-1]\n"),
    ("count_vowels", "count_vowels(s: str) -> int", "Count the vowels (a, e, i, o, u, any case) in s.",
     ["count_vowels('hello')"], ["count_vowels('')", "count_vowels('AEIOU xyz')", "count_vowels('rhythm')"],
     "def count_vowels(s):\n    return sum(c in 'aeiou' for c in s.lower())\n"),
    ("fizzbuzz", "fizzbuzz(n: int) -> str",
     "Return 'Fizz' if n is divisible by 3, 'Buzz' if by 5, 'FizzBuzz' if by both, else str(n).",
     ["fizzbuzz(3)"], ["fizzbuzz(5)", "fizzbuzz(15)", "fizzbuzz(7)", "fizzbuzz(30)"],
     "def fizzbuzz(n):\n    if n % 15 == 0:\n        return 'FizzBuzz'\n    if n % 3 == 0:\n        return 'Fizz'\n"
     "    if n % 5 == 0:\n        return 'Buzz'\n    return str(n)\n"),
    ("factorial", "factorial(n: int) -> int", "Return n! for n >= 0.",
     ["factorial(4)"], ["factorial(0)", "factorial(1)", "factorial(10)"],
     "def factorial(n):\n    result = 1\n    for k in range(2, n + 1):\n        result *= k\n    return result\n"),
    ("fibonacci", "fibonacci(n: int) -> int", "Return the n-th Fibonacci number (fibonacci(0) = 0, fibonacci(1) = 1).",
     ["fibonacci(6)"], ["fibonacci(0)", "fibonacci(1)", "fibonacci(20)"],
     "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n"),
    ("is_prime", "is_prime(n: int) -> bool", "True when n is a prime number.",
     ["is_prime(7)"], ["is_prime(1)", "is_prime(2)", "is_prime(91)", "is_prime(97)", "is_prime(0)"],
     "def is_prime(n):\n    if n < 2:\n        return False\n    k = 2\n    while k * k <= n:\n"
     "        if n % k == 0:\n            return False\n        k += 1\n    return True\n"),
    ("running_max", "running_max(xs: list[int]) -> list[int]", "Return the running maximum of xs.",
     ["running_max([1, 3, 2])"], ["running_max([])", "running_max([5, 4, 6, 1])", "running_max([-3, -5, -1])"],
     "def running_max(xs):\n    out = []\n    for x in xs:\n        out.append(x if not out else max(out[-1], x))\n"
     "    return out\n"),
    ("second_largest", "second_largest(xs: list[int]) -> int | None",
     "Return the second largest distinct value of xs, or None when there is none.",
     ["second_largest([4, 1, 3])"], ["second_largest([5, 5])", "second_largest([])", "second_largest([2, 9, 9, 7])"],
     "def second_largest(xs):\n    values = sorted(set(xs))\n    return values[-2] if len(values) >= 2 else None\n"),
    ("flatten_once", "flatten_once(xss: list[list]) -> list", "Concatenate the inner lists of xss.",
     ["flatten_once([[1], [2, 3]])"], ["flatten_once([])", "flatten_once([[], [1], []])", "flatten_once([['a'], ['b', 'c']])"],
     "def flatten_once(xss):\n    return [x for xs in xss for x in xs]\n"),
    ("chunk_list", "chunk_list(xs: list, size: int) -> list[list]",
     "Split xs into consecutive chunks of `size` items (the last one may be shorter).",
     ["chunk_list([1, 2, 3], 2)"], ["chunk_list([], 3)", "chunk_list([1, 2, 3, 4], 2)", "chunk_list([1, 2, 3, 4, 5], 3)"],
     "def chunk_list(xs, size):\n    return [xs[i:i + size] for i in range(0, len(xs), size)]\n"),
    ("word_count", "word_count(text: str) -> dict[str, int]",
     "Count the occurrences of each lower-cased whitespace-separated word.",
     ["word_count('a b a')"], ["word_count('')", "word_count('The the THE cat')", "word_count('x  y\\nx')"],
     "def word_count(text):\n    counts = {}\n    for word in text.lower().split():\n"
     "        counts[word] = counts.get(word, 0) + 1\n    return counts\n"),
    ("caesar_shift", "caesar_shift(s: str, k: int) -> str",
     "Shift each lower-case letter k places forward in the alphabet (wrapping around); leave other characters.",
     ["caesar_shift('abc', 1)"], ["caesar_shift('xyz', 3)", "caesar_shift('hello, world', 13)", "caesar_shift('Abc', 26)"],
     "def caesar_shift(s, k):\n    return ''.join(chr((ord(c) - 97 + k) % 26 + 97) if 'a' <= c <= 'z' else c"
     " for c in s)\n"),
    ("digit_sum", "digit_sum(n: int) -> int", "Return the sum of the decimal digits of |n|.",
     ["digit_sum(123)"], ["digit_sum(0)", "digit_sum(-907)", "digit_sum(99999)"],
     "def digit_sum(n):\n    return sum(int(d) for d in str(abs(n)))\n"),
    ("gcd_of", "gcd_of(a: int, b: int) -> int", "Return the greatest common divisor of a and b (non-negative).",
     ["gcd_of(12, 18)"], ["gcd_of(7, 13)", "gcd_of(0, 5)", "gcd_of(100, 75)"],
     "def gcd_of(a, b):\n    a, b = abs(a), abs(b)\n    while b:\n        a, b = b, a % b\n    return a\n"),
    ("unique_sorted", "unique_sorted(xs: list[int]) -> list[int]", "Return the distinct values of xs in ascending order.",
     ["unique_sorted([3, 1, 3])"], ["unique_sorted([])", "unique_sorted([5, -1, 5, 2, -1])", "unique_sorted([1])"],
     "def unique_sorted(xs):\n    return sorted(set(xs))\n"),
    ("title_case", "title_case(s: str) -> str",
     "Capitalise the first letter of every space-separated word and lower-case the rest.",
     ["title_case('hello world')"], ["title_case('')", "title_case('hELLO wORLD')", "title_case('a b c')"],
     "def title_case(s):\n    return ' '.join(w[:1].upper() + w[1:].lower() for w in s.split(' '))\n"),
    ("count_char", "count_char(s: str, c: str) -> int", "Count how many times the character c occurs in s.",
     ["count_char('banana', 'a')"], ["count_char('', 'a')", "count_char('mississippi', 's')", "count_char('abc', 'z')"],
     "def count_char(s, c):\n    return s.count(c)\n"),
    ("merge_sorted", "merge_sorted(a: list[int], b: list[int]) -> list[int]",
     "Merge two ascending lists into one ascending list.",
     ["merge_sorted([1, 4], [2, 3])"], ["merge_sorted([], [])", "merge_sorted([1, 1], [1])", "merge_sorted([5], [1, 9])"],
     "def merge_sorted(a, b):\n    return sorted(a + b)\n"),
    ("binary_string", "binary_string(n: int) -> str", "Return the binary representation of n >= 0 without prefix.",
     ["binary_string(5)"], ["binary_string(0)", "binary_string(1)", "binary_string(255)"],
     "def binary_string(n):\n    return bin(n)[2:]\n"),
    ("mean_value", "mean_value(xs: list[float]) -> float", "Return the arithmetic mean of xs, or 0.0 for an empty list.",
     ["mean_value([1, 2, 3])"], ["mean_value([])", "mean_value([2.5])", "mean_value([1, 2])"],
     "def mean_value(xs):\n    return sum(xs) / len(xs) if xs else 0.0\n"),
    ("rotate_left", "rotate_left(xs: list, k: int) -> list", "Rotate xs left by k positions (k may exceed len(xs)).",
     ["rotate_left([1, 2, 3], 1)"], ["rotate_left([], 3)", "rotate_left([1, 2, 3, 4], 6)", "rotate_left([1, 2], 0)"],
     "def rotate_left(xs, k):\n    if not xs:\n        return []\n    k %= len(xs)\n    return xs[k:] + xs[:k]\n"),
    ("longest_word", "longest_word(text: str) -> str",
     "Return the longest whitespace-separated word (the first one on ties), or '' for no words.",
     ["longest_word('a bbb cc')"], ["longest_word('')", "longest_word('ab cd ef')", "longest_word('one three five')"],
     "def longest_word(text):\n    best = ''\n    for word in text.split():\n        if len(word) > len(best):\n"
     "            best = word\n    return best\n"),
    ("remove_duplicates", "remove_duplicates(xs: list) -> list", "Remove repeated items of xs, keeping first occurrences in order.",
     ["remove_duplicates([1, 2, 1])"], ["remove_duplicates([])", "remove_duplicates(['b', 'a', 'b', 'c', 'a'])",
                                         "remove_duplicates([3, 3, 3])"],
     "def remove_duplicates(xs):\n    seen, out = set(), []\n    for x in xs:\n        if x not in seen:\n"
     "            seen.add(x)\n            out.append(x)\n    return out\n"),
    ("sum_of_squares", "sum_of_squares(n: int) -> int", "Return 1*1 + 2*2 + ... + n*n (0 for n <= 0).",
     ["sum_of_squares(3)"], ["sum_of_squares(0)", "sum_of_squares(1)", "sum_of_squares(10)", "sum_of_squares(-2)"],
     "def sum_of_squares(n):\n    return sum(k * k for k in range(1, n + 1))\n"),
    ("is_anagram", "is_anagram(a: str, b: str) -> bool", "True when a and b contain the same letters (case-insensitive, spaces ignored).",
     ["is_anagram('listen', 'silent')"], ["is_anagram('abc', 'abd')", "is_anagram('Dormitory', 'dirty room')", "is_anagram('', '')"],
     "def is_anagram(a, b):\n    norm = lambda s: sorted(s.replace(' ', '').lower())\n    return norm(a) == norm(b)\n"),
    ("clamp_value", "clamp_value(x: int, low: int, high: int) -> int", "Return x limited to the range [low, high].",
     ["clamp_value(5, 0, 3)"], ["clamp_value(-1, 0, 3)", "clamp_value(2, 0, 3)", "clamp_value(3, 3, 3)"],
     "def clamp_value(x, low, high):\n    return max(low, min(high, x))\n"),
    ("pairwise_diff", "pairwise_diff(xs: list[int]) -> list[int]", "Return the differences xs[i+1] - xs[i].",
     ["pairwise_diff([1, 4, 9])"], ["pairwise_diff([])", "pairwise_diff([5])", "pairwise_diff([3, 1, 4, 1])"],
     "def pairwise_diff(xs):\n    return [b - a for a, b in zip(xs, xs[1:])]\n"),
    ("vowel_positions", "vowel_positions(s: str) -> list[int]", "Return the indices of the vowels (aeiou, any case) in s.",
     ["vowel_positions('banana')"], ["vowel_positions('')", "vowel_positions('xyz')", "vowel_positions('AbEcI')"],
     "def vowel_positions(s):\n    return [i for i, c in enumerate(s) if c.lower() in 'aeiou']\n"),
    ("matrix_transpose", "matrix_transpose(m: list[list[int]]) -> list[list[int]]", "Return the transpose of a rectangular matrix.",
     ["matrix_transpose([[1, 2], [3, 4]])"], ["matrix_transpose([])", "matrix_transpose([[1, 2, 3]])",
                                            "matrix_transpose([[1], [2], [3]])"],
     "def matrix_transpose(m):\n    return [list(row) for row in zip(*m)]\n"),
    ("run_length", "run_length(s: str) -> str", "Run-length encode s: 'aaab' -> 'a3b1'.",
     ["run_length('aaab')"], ["run_length('')", "run_length('abc')", "run_length('zzzzzzzzzzzz')"],
     "def run_length(s):\n    out, i = [], 0\n    while i < len(s):\n        j = i\n        while j < len(s) and s[j] == s[i]:\n"
     "            j += 1\n        out.append(s[i] + str(j - i))\n        i = j\n    return ''.join(out)\n"),
]


def _evaluate(solution: str, calls: list[str]) -> list[str]:
    namespace: dict = {}
    exec(compile(solution, "<reference>", "exec"), namespace)  # trusted reference code
    return [repr(eval(call, namespace)) for call in calls]


def generate_tasks(seed: int, count: int) -> list[dict]:
    """One task per function (at most `count`), in a seeded order."""
    rows = list(FUNCTIONS)
    random.Random(seed).shuffle(rows)
    tasks = []
    for index, (entry, signature, spec, examples, hidden, solution) in enumerate(rows[:count]):
        shown = [f"{call} == {value}" for call, value in zip(examples, _evaluate(solution, examples))]
        tasks.append({
            "id": f"code_pair-{entry}",
            "prompt": f"Write def {signature}. {spec} Example: {'; '.join(shown)}",
            "metadata": {
                "entry": entry,
                "examples": shown,
                "tests": [{"call": call, "expected": value} for call, value in zip(hidden, _evaluate(solution, hidden))],
                "solution": solution,
            },
            "difficulty": float(len(solution.splitlines())),
        })
    return tasks


def expert(agent: str, observation: str, task) -> str:
    """The coder writes the reference solution; the tester checks the visible example and approves."""
    if agent == "coder":
        return task.metadata["solution"]
    checks = "\n".join(f"assert {example}" for example in task.metadata["examples"])
    return f"{checks}\nAPPROVED"


_ASSERT = re.compile(r"^\s*assert\s+.+$", re.MULTILINE)
_VERIFIER = None


def tester_tests_valid(item, candidate) -> float:
    """The tester's contribution: the fraction of its `assert` lines (at most 8) that mention the task's
    function and hold for the reference solution (run in the sandbox). 0 when it wrote no such line."""
    global _VERIFIER
    entry = item.metadata.get("entry", "")
    lines = [line.strip() for line in _ASSERT.findall(candidate.text or "")
             if re.search(rf"\b{re.escape(entry)}\s*\(", line)][:8]
    if not lines:
        return 0.0
    from judges.code import CodeTestsVerifier, parse_tests
    from judges.types import Candidate, Item

    valid = []
    for line in lines:
        try:
            parse_tests([line])
            valid.append(line)
        except ValueError:
            continue
    if not valid:
        return 0.0
    if _VERIFIER is None:
        _VERIFIER = CodeTestsVerifier(timeout_s=2.0, memory_mb=256)
    judgment = _VERIFIER.score(Item(prompt="", metadata={"tests": valid}),
                               [Candidate(text=item.metadata["solution"])])[0]
    if not judgment.ok:
        return judgment
    return judgment.score * len(valid) / len(lines)
