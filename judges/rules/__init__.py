"""Rule verifiers: deterministic scorers under the same `Scorer` interface as model judges.

    registry.py      build_scorer(kind, params, base_dir): a verifier from a reward spec
    basic.py         exact, numeric, regex, contains, JSON-schema, callable, tool-use, process, format
    patterns.py      scenario regexes compiled with RE2 (linear time)
    sql.py           SQL result sets on SQLite and its hidden variants
    code.py          code against hidden tests, every verdict made outside the sandbox
    code_harness.py  the sandboxed half of the code verifier
    sandbox.py       run untrusted Python under kernel layers (parent side)
    sandbox_child.py the child's first code; sandbox_layers.py: seccomp BPF and Landlock paths
    sandbox_interpreter.py  which interpreter the child runs, and the major.minor check
    sandbox_pipes.py the pipes to the child and the reading of its reports
    sandbox_disk.py  the parent's watch on the run folder's disk use
    sandbox_workdir.py  run folders, locked while they run; the sweep of those a killed parent left

May import: common (imports), judges' top (types, strict_json).
"""
