"""Rollout engines: where a model actor's tokens are generated, behind one interface.

    base.py        the interface (`RolloutEngine`), its sampling settings, its errors, adapter names
    inprocess.py   this process: the KV-cache sampler of trainers/policy/generation.py on the live weights
    http.py        an OpenAI-compatible generation server (vLLM, or `marl serve --enable-lora`): token-id
                   prompts, logprobs, LoRA adapters published under versioned names, stale answers refused
    server.py      `marl serve`: the OpenAI-compatible HTTP server over a local model (chat, completions)
    limits.py      its limits (`ServeLimits`, a flag each) and the file descriptors they need
    connections.py its connections: request heads read in the accept loop, read and idle deadlines, a
                   bounded worker pool and queue answering 503 when full, connections within ulimit -n
    serving.py     the server side of that protocol in `marl serve` (/v1/completions, load/unload adapters)
    correction.py  the sampler/trainer mismatch and its truncated importance-sampling weights (train.tis_cap)

May import: marl, judges.model, trainers.policy, trainers.records.
"""
