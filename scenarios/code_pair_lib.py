"""Tasks, expert and the tester's scorer of the code_pair scenario.

Each task is a small Python function: a signature, a one-line spec, visible examples (in the prompt)
and hidden tests (in metadata["tests"], the `{"call", "expected"}` format of judges.rules.code). Expected
values are computed once from the reference solution (trusted code, run here, never in the prompt).

The tester is scored by `tester_tests_valid` with a rule a tautology cannot pass: a check earns credit
only as an `assert f(<literals>) == <literal>` that holds for the reference solution and fails for at
least one known-wrong implementation (MUTANTS, in metadata["mutants"]), each run in its own sandbox
process with no model-written code in it; the comparisons happen outside the sandbox. Nothing of the
reference, the mutants or the expected values enters a process that runs the coder's code.
"""

from __future__ import annotations

import ast
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
     ["rotate_left([1, 2, 3], 1)"], ["rotate_left([], 3)", "rotate_left([1, 2, 3, 4], 6)", "rotate_left([1, 2], 0)",
      "rotate_left([1, 2, 3, 4, 5], 7)"],
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
     ["clamp_value(5, 0, 3)"], ["clamp_value(-1, 0, 3)", "clamp_value(2, 0, 3)", "clamp_value(3, 3, 3)",
                                 "clamp_value(9, 2, 7)"],
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



# Known-wrong implementations, per function: the first is wrong on the visible example's kind of input,
# the second passes it and fails a hidden test (an edge case). A task's metadata["mutants"] holds them
# made to pass the prompt's visible examples (`fit_examples`), so an assert copied from the prompt
# catches none and earns nothing. They score the tester (tester_tests_valid) and stay outside every
# sandbox process that runs model-written code.
MUTANTS: dict[str, tuple[str, str]] = {
    "add_numbers": ("def add_numbers(a, b):\n    return a - b\n", "def add_numbers(a, b):\n    return abs(a) + b\n"),
    "reverse_string": ("def reverse_string(s):\n    return s\n", "def reverse_string(s):\n    return s[::-1].lower()\n"),
    "is_palindrome": ("def is_palindrome(s):\n    return s == s[::-1]\n",
                      "def is_palindrome(s):\n    t = [c.lower() for c in s]\n    return t == t[::-1]\n"),
    "count_vowels": ("def count_vowels(s):\n    return sum(c in 'ae' for c in s)\n",
                     "def count_vowels(s):\n    return sum(c in 'aeiou' for c in s)\n"),
    "fizzbuzz": ("def fizzbuzz(n):\n    return str(n)\n",
                 "def fizzbuzz(n):\n    if n % 3 == 0:\n        return 'Fizz'\n    if n % 5 == 0:\n        return 'Buzz'\n"
                 "    if n % 15 == 0:\n        return 'FizzBuzz'\n    return str(n)\n"),
    "factorial": ("def factorial(n):\n    result = 1\n    for k in range(2, n):\n        result *= k\n    return result\n",
                  "def factorial(n):\n    if n == 0:\n        return 0\n    result = 1\n    for k in range(2, n + 1):\n"
                  "        result *= k\n    return result\n"),
    "fibonacci": ("def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n + 1):\n        a, b = b, a + b\n    return a\n",
                  "def fibonacci(n):\n    if n == 0:\n        return 1\n    a, b = 0, 1\n    for _ in range(n):\n"
                  "        a, b = b, a + b\n    return a\n"),
    "is_prime": ("def is_prime(n):\n    return n % 2 == 0\n",
                 "def is_prime(n):\n    return n >= 1 and all(n % k for k in range(2, n))\n"),
    "running_max": ("def running_max(xs):\n    return list(xs)\n",
                    "def running_max(xs):\n    best, out = 0, []\n    for x in xs:\n        best = max(best, x)\n"
                    "        out.append(best)\n    return out\n"),
    "second_largest": ("def second_largest(xs):\n    return max(xs) if xs else None\n",
                       "def second_largest(xs):\n    values = sorted(xs)\n    return values[-2] if len(values) >= 2 else None\n"),
    "flatten_once": ("def flatten_once(xss):\n    return xss\n",
                     "def flatten_once(xss):\n    return [x for xs in xss for x in xs] or None\n"),
    "chunk_list": ("def chunk_list(xs, size):\n    return [xs[i:i + size] for i in range(0, len(xs) - size + 1, size)]\n",
                   "def chunk_list(xs, size):\n    return [xs[i:i + size] for i in range(0, len(xs), size)] or [[]]\n"),
    "word_count": ("def word_count(text):\n    return {word: 1 for word in text.lower().split()}\n",
                   "def word_count(text):\n    counts = {}\n    for word in text.split():\n"
                   "        counts[word] = counts.get(word, 0) + 1\n    return counts\n"),
    "caesar_shift": ("def caesar_shift(s, k):\n    return ''.join(chr((ord(c) - 97 - k) % 26 + 97) if 'a' <= c <= 'z' else c"
                     " for c in s)\n",
                     "def caesar_shift(s, k):\n    return ''.join(chr(ord(c) + k) if 'a' <= c <= 'z' else c for c in s)\n"),
    "digit_sum": ("def digit_sum(n):\n    return len(str(abs(n)))\n",
                  "def digit_sum(n):\n    return sum(int(d) for d in str(n).replace('-', '1'))\n"),
    "gcd_of": ("def gcd_of(a, b):\n    return min(a, b)\n",
               "def gcd_of(a, b):\n    for k in range(min(a, b), 0, -1):\n        if a % k == 0 and b % k == 0:\n"
               "            return k\n    return 1\n"),
    "unique_sorted": ("def unique_sorted(xs):\n    return sorted(xs)\n",
                      "def unique_sorted(xs):\n    return sorted(set(x for x in xs if x > 0))\n"),
    "title_case": ("def title_case(s):\n    return s.upper()\n",
                   "def title_case(s):\n    return ' '.join(w[:1].upper() + w[1:] for w in s.split(' '))\n"),
    "count_char": ("def count_char(s, c):\n    return s.count(c) - 1\n",
                   "def count_char(s, c):\n    return s.count(c) if c in s else -1\n"),
    "merge_sorted": ("def merge_sorted(a, b):\n    return a + b\n", "def merge_sorted(a, b):\n    return sorted(set(a + b))\n"),
    "binary_string": ("def binary_string(n):\n    return bin(n)\n",
                      "def binary_string(n):\n    out = ''\n    while n:\n        out = str(n % 2) + out\n        n //= 2\n"
                      "    return out\n"),
    "mean_value": ("def mean_value(xs):\n    return sum(xs) / (len(xs) + 1) if xs else 0.0\n",
                   "def mean_value(xs):\n    return sum(xs) // len(xs) if xs else 0.0\n"),
    "rotate_left": ("def rotate_left(xs, k):\n    if not xs:\n        return []\n    k %= len(xs)\n    return xs[-k:] + xs[:-k]\n",
                    "def rotate_left(xs, k):\n    return xs[k:] + xs[:k]\n"),
    "longest_word": ("def longest_word(text):\n    return min(text.split(), key=len) if text.split() else ''\n",
                     "def longest_word(text):\n    best = ''\n    for word in text.split():\n        if len(word) >= len(best):\n"
                     "            best = word\n    return best\n"),
    "remove_duplicates": ("def remove_duplicates(xs):\n    return list(xs)\n",
                          "def remove_duplicates(xs):\n    return sorted(set(xs))\n"),
    "sum_of_squares": ("def sum_of_squares(n):\n    return sum(k * k for k in range(1, n))\n",
                       "def sum_of_squares(n):\n    return n * (n + 1) * (2 * n + 1) // 6\n"),
    "is_anagram": ("def is_anagram(a, b):\n    return a == b\n",
                   "def is_anagram(a, b):\n    return sorted(a.lower()) == sorted(b.lower())\n"),
    "clamp_value": ("def clamp_value(x, low, high):\n    return max(low, x)\n",
                    "def clamp_value(x, low, high):\n    return min(high, x)\n"),
    "pairwise_diff": ("def pairwise_diff(xs):\n    return [a - b for a, b in zip(xs, xs[1:])]\n",
                      "def pairwise_diff(xs):\n    return [abs(b - a) for a, b in zip(xs, xs[1:])]\n"),
    "vowel_positions": ("def vowel_positions(s):\n    return [i for i, c in enumerate(s) if c not in 'aeiou']\n",
                        "def vowel_positions(s):\n    return [i for i, c in enumerate(s) if c in 'aeiou']\n"),
    "matrix_transpose": ("def matrix_transpose(m):\n    return m\n",
                         "def matrix_transpose(m):\n    return [[row[i] for row in m] for i in range(len(m))]\n"),
    "run_length": ("def run_length(s):\n    return ''.join(c + '1' for c in s)\n",
                   "def run_length(s):\n    out, i = [], 0\n    while i < len(s):\n        j = i\n"
                   "        while j < len(s) and s[j] == s[i]:\n            j += 1\n        out.append(s[i] + str(min(j - i, 9)))\n"
                   "        i = j\n    return ''.join(out)\n"),
}

def _evaluate(solution: str, calls: list[str]) -> list[str]:
    namespace: dict = {}
    exec(compile(solution, "<reference>", "exec"), namespace)  # trusted reference code
    return [repr(eval(call, namespace)) for call in calls]


# Families of one-line functions with a constant K in the spec (entry, signature, spec, visible example,
# hidden tests, solution, two mutants; each a format string of k): the same function asked with another
# K. A held-out fill has a K no training task of its family has, so the coder must carry K from the spec
# into its code; the mutants are the usual slips (the wrong operator, K off by one).
FAMILIES: list[tuple] = [
    ("add_k", "add_k(x: int) -> int", "Return x plus {k}.", ["add_k(1)"], ["add_k(0)", "add_k(-5)", "add_k(100)"],
     "def add_k(x):\n    return x + {k}\n", "def add_k(x):\n    return x - {k}\n",
     "def add_k(x):\n    return x + {k1}\n"),
    ("times_k", "times_k(x: int) -> int", "Return x multiplied by {k}.", ["times_k(2)"],
     ["times_k(0)", "times_k(-3)", "times_k(11)"], "def times_k(x):\n    return x * {k}\n",
     "def times_k(x):\n    return x + {k}\n", "def times_k(x):\n    return x * {k1}\n"),
    ("repeat_k", "repeat_k(s: str) -> str", "Return s repeated {k} times.", ["repeat_k('ab')"],
     ["repeat_k('')", "repeat_k('x')", "repeat_k('hey')"], "def repeat_k(s):\n    return s * {k}\n",
     "def repeat_k(s):\n    return s\n", "def repeat_k(s):\n    return s * {k1}\n"),
    ("first_k", "first_k(xs: list) -> list", "Return the first {k} items of xs.", ["first_k([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19])"],
     ["first_k([])", "first_k([7])", "first_k(list(range(30, 0, -1)))"], "def first_k(xs):\n    return xs[:{k}]\n",
     "def first_k(xs):\n    return xs[{k}:]\n", "def first_k(xs):\n    return xs[:{k1}]\n"),
    ("divisible_by_k", "divisible_by_k(n: int) -> bool", "True when n is divisible by {k}.",
     ["divisible_by_k({k})"], ["divisible_by_k(0)", "divisible_by_k({k1})", "divisible_by_k({k} * 7)",
                               "{divisors}"],
     "def divisible_by_k(n):\n    return n % {k} == 0\n", "def divisible_by_k(n):\n    return n % {k} != 0\n",
     "def divisible_by_k(n):\n    return n % {k1} == 0\n"),
    ("count_above_k", "count_above_k(xs: list[int]) -> int", "Count the items of xs greater than {k}.",
     ["count_above_k([1, 5, 9, 13, 17])"], ["count_above_k([])", "count_above_k(list(range(20)))",
                                       "count_above_k([{k}, {k1}, {k}])"],
     "def count_above_k(xs):\n    return sum(x > {k} for x in xs)\n",
     "def count_above_k(xs):\n    return sum(x < {k} for x in xs)\n",
     "def count_above_k(xs):\n    return sum(x >= {k} for x in xs)\n"),
]
FAMILY_KS = range(2, 14)
HELD_OUT_FILLS = 20  # family fills held out: the last tasks, where tasks.eval_count takes them from


# How a tester's arguments are compared with the prompt's visible examples: tuple, list and str as
# sequences of their items (a one-character str is an item), sets sorted, bool/int/float as numbers,
# so `running_max((1, 3, 2))`, `count_char(['b', 'a', ...], 'a')` or `add_numbers(2.0, True + 2)` is
# the example `running_max([1, 3, 2])` respelt. One source, run here (the scorer) and written into
# each fitted known-wrong implementation (the wrapper below), so both compare alike.
_NORMALISED_SOURCE = """
def _marl_normalised(value):
    if isinstance(value, (bool, int, float)):
        number = int(value) if isinstance(value, bool) else value
        return ("number", int(number) if isinstance(number, float) and number.is_integer() else number)
    if isinstance(value, str):
        return ("item", value) if len(value) == 1 else ("sequence", tuple(("item", c) for c in value))
    if isinstance(value, (list, tuple)):
        return ("sequence", tuple(_marl_normalised(item) for item in value))
    if isinstance(value, (set, frozenset)):
        items = [_marl_normalised(item) for item in value]
        return ("sequence", tuple(sorted(items, key=lambda i: (i[0], i[1] if i[0] == "number" else repr(i)))))
    if isinstance(value, dict):
        pairs = ((_marl_normalised(k), _marl_normalised(v)) for k, v in value.items())
        return ("mapping", tuple(sorted(pairs, key=repr)))
    return ("other", repr(value))
"""
_namespace: dict = {}
exec(_NORMALISED_SOURCE, _namespace)  # trusted: the text above
normalised = _namespace["_marl_normalised"]
normalised.__doc__ = "`value` as the example check compares it (see _NORMALISED_SOURCE)."


def fit_examples(mutant: str, entry: str, examples: list[str], values: list[str]) -> str:
    """`mutant` made to return the reference's value (`values`, reprs) on each visible example's
    arguments, as a coder who fitted the prompt's examples would: a check copied from the prompt
    (any spelling of the same arguments: keywords, 3.0 for 3, a tuple or a str for a list) passes
    it, so it catches nothing. The arguments are compared `normalised`, as the scorer compares them.
    The wrapper keeps the mutant's parameters, so Python binds the call as it would the mutant's."""
    from judges.rules.code_harness import decode_literal

    function = next(node for node in ast.parse(mutant).body
                    if isinstance(node, ast.FunctionDef) and node.name == entry)
    params = ", ".join(arg.arg for arg in function.args.args)
    lines = [mutant.rstrip("\n"), f"_unfitted_{entry} = {entry}", _NORMALISED_SOURCE, "",
             f"def {entry}({params}):", f"    _arguments = _marl_normalised(({params},))"]
    for call, value in zip(examples, values):
        arguments = tuple(decode_literal(ast.unparse(arg)) for arg in ast.parse(call, mode="eval").body.args)
        lines += [f"    if _arguments == {normalised(arguments)!r}:", f"        return {value}"]
    return "\n".join(lines + [f"    return _unfitted_{entry}({params})", ""])


def signature_params(signature: str) -> list[list[str]]:
    """[[name, annotation], ...] of a `name(a: int, xs: list[int]) -> ...` signature ('' unannotated)."""
    function = ast.parse(f"def {signature.split(' -> ')[0]}: pass").body[0]
    return [[arg.arg, ast.unparse(arg.annotation) if arg.annotation else ""] for arg in function.args.args]


def fits(value, annotation: str) -> bool:
    """True when `value` has the declared type `annotation` (int, float, str, bool, None, list[int],
    list[list], dict[str, int], X | Y; an int is a float, a bool is neither; unknown names fit)."""
    return _fits(value, ast.parse(annotation, mode="eval").body) if annotation else True


_KINDS = {"int": int, "float": (int, float), "str": str, "bool": bool, "list": list, "dict": dict,
          "tuple": tuple, "set": set}


def _fits(value, node: ast.AST) -> bool:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _fits(value, node.left) or _fits(value, node.right)
    if isinstance(node, ast.Constant) and node.value is None:
        return value is None
    name = node.value.id if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) else \
        node.id if isinstance(node, ast.Name) else None
    if name not in _KINDS:
        return True  # an annotation this check does not know (Any, a class) rejects nothing
    if not isinstance(value, _KINDS[name]) or (isinstance(value, bool) and name != "bool"):
        return False
    if not isinstance(node, ast.Subscript):
        return True
    inner = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
    if name in ("list", "set"):
        return all(_fits(item, inner[0]) for item in value)
    if name == "dict" and len(inner) == 2:
        return all(_fits(k, inner[0]) and _fits(v, inner[1]) for k, v in value.items())
    return True


def _task(entry: str, signature: str, spec: str, examples: list[str], hidden: list[str], solution: str,
          mutants: list[str], task_id: str) -> dict:
    values = _evaluate(solution, examples)
    shown = [f"{call} == {value}" for call, value in zip(examples, values)]
    return {
        "id": task_id,
        "prompt": f"Write def {signature}. {spec} Example: {'; '.join(shown)}",
        "metadata": {
            "entry": entry,
            "params": signature_params(signature),  # [name, declared type]: a tester's arguments must fit them
            "examples": shown,
            "tests": [{"call": call, "expected": value} for call, value in zip(hidden, _evaluate(solution, hidden))],
            "solution": solution,
            "mutants": [fit_examples(mutant, entry, examples, values) for mutant in mutants],
        },
        "difficulty": float(len(solution.splitlines())),
    }


def family_tasks(seed: int) -> list[dict]:
    """Every fill of every family (K in FAMILY_KS), shuffled with `seed`. A hidden test "{divisors}"
    stands for one call per proper divisor d >= 2 of K (`divisible_by_k(d)`), so that the solution of a
    smaller K that divides this one (a training fill's) fails it."""
    tasks = []
    for entry, signature, spec, examples, hidden, solution, *mutants in FAMILIES:
        for k in FAMILY_KS:
            fill = {"k": k, "k1": k + 1}
            calls = [h.format(**fill) for h in hidden if h != "{divisors}"]
            if "{divisors}" in hidden:
                calls += [f"{entry}({d})" for d in range(2, k) if k % d == 0]
            tasks.append(_task(entry, signature, spec.format(**fill), [e.format(**fill) for e in examples],
                               calls, solution.format(**fill), [m.format(**fill) for m in mutants],
                               f"code_pair-{entry}-{k}"))
    random.Random(seed).shuffle(tasks)
    return tasks


def generate_tasks(seed: int, count: int) -> list[dict]:
    """The hand-written functions (FUNCTIONS, in a seeded order) and the family fills, the first `count`:
    the functions and all but HELD_OUT_FILLS fills first (training), then those fills (held out by the
    scenario's tasks.eval_count, which is HELD_OUT_FILLS)."""
    rows = list(FUNCTIONS)
    random.Random(seed).shuffle(rows)
    tasks = [_task(entry, signature, spec, examples, hidden, solution, MUTANTS[entry], f"code_pair-{entry}")
             for entry, signature, spec, examples, hidden, solution in rows]
    fills = family_tasks(seed)
    tasks += fills[HELD_OUT_FILLS:] + fills[:HELD_OUT_FILLS]
    return tasks[:count]


def expert(agent: str, observation: str, task) -> str:
    """The coder writes the reference solution; the tester asserts the hidden tests that catch a
    known-wrong implementation (the prompt's examples catch none) and approves."""
    if agent == "coder":
        return task.metadata["solution"]
    checks = [f"assert {call} == {expected}" for call, expected in discriminating_tests(task.metadata)]
    entry = task.metadata["entry"]  # only literal arguments earn (tester_call_test): list(range(20)) would not
    return "\n".join([line for line in checks if tester_call_test(line, entry)][:MAX_CHECKS] + ["APPROVED"])


def discriminating_tests(metadata: dict) -> list[tuple[str, str]]:
    """The (call, expected) hidden tests of a task that at least one of its known-wrong
    implementations fails, compared as the verifier compares (trusted code, run here)."""
    from judges.rules.code import values_match

    tests = [(test["call"], test["expected"]) for test in metadata["tests"]]
    calls = [call for call, _ in tests]
    outputs = [_evaluate_or_raise(mutant, calls) for mutant in metadata["mutants"]]
    return [(call, expected) for index, (call, expected) in enumerate(tests)
            if any(not values_match(output[index], expected) for output in outputs)]


def _evaluate_or_raise(solution: str, calls: list[str]) -> list[str]:
    """Like _evaluate, with a call that raises giving its exception's name (never a literal)."""
    namespace: dict = {}
    exec(compile(solution, "<known-wrong>", "exec"), namespace)  # trusted scenario code
    outputs = []
    for call in calls:
        try:
            outputs.append(repr(eval(call, namespace)))
        except Exception as error:
            outputs.append(type(error).__name__)
    return outputs


_ASSERT = re.compile(r"^\s*assert\b.*$", re.MULTILINE)
MAX_CHECKS = 8


def tester_call_test(line: str, entry: str) -> tuple[str, str] | None:
    """(call, expected) when `line` is `assert entry(<literals>) == <literal>` (either side), with
    the literals normalised; None for anything else (it can earn no credit), including a line the
    parser cannot handle (deep nesting, a number past int's digit limit): the tester's line, its loss."""
    try:
        return _call_test(line, entry)
    except Exception:  # only the tester's text is parsed here: any failure is a line that earns nothing
        return None


def _call_test(line: str, entry: str) -> tuple[str, str] | None:
    from judges.rules.code_harness import decode_literal

    tree = ast.parse(line.strip())
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.Assert) or tree.body[0].msg is not None:
        return None
    test = tree.body[0].test
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return None
    for call, other in ((test.left, test.comparators[0]), (test.comparators[0], test.left)):
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == entry:
            try:
                args = [repr(decode_literal(ast.unparse(arg))) for arg in call.args]
                args += [f"{k.arg}={decode_literal(ast.unparse(k.value))!r}" for k in call.keywords if k.arg]
                expected = repr(decode_literal(ast.unparse(other)))
            except ValueError:
                return None
            if len(args) == len(call.args) + len(call.keywords):
                return f"{entry}({', '.join(args)})", expected
    return None


def earns_nothing(call: str, metadata: dict) -> bool:
    """True when a tester's check of `call` (its literal arguments) can earn nothing: the arguments do
    not bind to the function's parameters or do not fit their declared types (metadata["params"];
    `times_k('')`, `add_numbers('a', 'b')`: a wrong type that only breaks a wrong implementation), or
    they are a visible example's arguments respelt (`normalised`: a tuple or a str for the list)."""
    params = metadata.get("params") or _params_of_examples(metadata)
    names = [name for name, _ in params]
    arguments = _bound(ast.parse(call, mode="eval").body, names)
    if arguments is None or not all(fits(value, annotation) for value, (_, annotation) in zip(arguments, params)):
        return True
    key = normalised(tuple(arguments))
    for example in metadata.get("examples", []):
        shown = _bound(ast.parse(example, mode="eval").body.left, names)
        if shown is not None and normalised(tuple(shown)) == key:
            return True
    return False


def _earns_nothing_or_unreadable(call: str, metadata: dict) -> bool:
    try:
        return earns_nothing(call, metadata)
    except Exception:  # arguments too deep to compare (RecursionError): that line's loss, not the tester's
        return True


def _params_of_examples(metadata: dict) -> list[list[str]]:
    """For a task without metadata["params"] (written before it existed): positional parameters typed
    as the first visible example's arguments are."""
    from judges.rules.code_harness import decode_literal

    call = ast.parse(metadata["examples"][0], mode="eval").body.left
    kinds = [type(decode_literal(ast.unparse(arg))).__name__ for arg in call.args]
    return [[f"_{index}", kind if kind in _KINDS else ""] for index, kind in enumerate(kinds)]


def _bound(call: ast.AST, names: list[str]) -> list | None:
    """The call's literal arguments in parameter order (keywords placed by name); None when they do
    not bind (too many or too few, an unknown or repeated name)."""
    from judges.rules.code_harness import decode_literal

    if not isinstance(call, ast.Call) or len(call.args) > len(names):
        return None
    bound = dict(zip(names, (decode_literal(ast.unparse(arg)) for arg in call.args)))
    for keyword in call.keywords:
        if keyword.arg not in names or keyword.arg in bound:
            return None
        bound[keyword.arg] = decode_literal(ast.unparse(keyword.value))
    return [bound[name] for name in names] if len(bound) == len(names) else None


def _claims(code: str, calls: list[str], entry: str) -> list:
    from judges.rules.code_harness import Claim, evaluate

    evaluation = evaluate(code, calls, entry=entry, timeout_s=2.0, memory_mb=256)
    return evaluation.claims or [Claim("missing")] * len(calls)


def tester_tests_valid(item, candidate):
    """The tester's score: the share of its `assert` lines that are discriminating checks.

    A line earns credit only if it is `assert <function>(<literals>) == <literal>` (either side; one
    of the first MAX_CHECKS such lines, repeats counted once), its arguments fit the declared types
    and are no visible example's, respelt or not (`earns_nothing`), the reference solution returns that
    literal, AND at least one known-wrong implementation (metadata["mutants"]) does not. Each
    implementation runs in a sandbox process of its own, on data only (no line of the tester's runs
    as code anywhere), and the comparisons are made here. So `assert True`, `assert True or f()`,
    `assert 1 == 1`, asserts that never call the function, and asserts that every implementation
    passes earn nothing, and every assert line counts in the denominator. 0.0 without assert lines; a
    sandbox failure is a failed Judgment, never a number.
    """
    from judges.rules.code_harness import SandboxError, claim_matches
    from judges.types import candidate_input, failed

    entry, text = item.metadata.get("entry", ""), candidate.text or ""
    with candidate_input("the tester's asserts"):  # a failure parsing them is the tester's 0, never a mask
        lines = _ASSERT.findall(text)
        tests = list(dict.fromkeys(test for test in (tester_call_test(line, entry) for line in lines) if test))
        # a wrong-typed argument or a respelt visible example earns nothing (the line still counts below)
        tests = [test for test in tests[:MAX_CHECKS] if not _earns_nothing_or_unreadable(test[0], item.metadata)]
    if not lines or not tests:
        return 0.0
    try:
        reference = _claims(item.metadata["solution"], [call for call, _ in tests], entry)
        with candidate_input("the tester's expected values"):
            kept = [test for test, claim in zip(tests, reference) if claim_matches(claim, test[1])]
        killed: set = set()
        for mutant in item.metadata.get("mutants", []):
            alive = [test for test in kept if test not in killed]
            if not alive:
                break
            claims = _claims(mutant, [call for call, _ in alive], entry)
            with candidate_input("the tester's expected values"):
                killed |= {test for test, claim in zip(alive, claims) if not claim_matches(claim, test[1])}
    except SandboxError as error:
        return failed("error", f"sandbox failure: {error}")
    return len(killed) / len(lines)
