"""Model judges: an LLM (or a simulation of one) says how good an answer is.

    prompted.py        judges that prompt an LLM for a verdict: pointwise, pairwise (both orders), listwise, panels
    prompts.py         MT-Bench style prompts and strict verdict parsers
    verdict.py         the verdict modes: text (MT-Bench) or logprobs (labels read from one token's probabilities)
    backend.py         the contract between judges and whatever answers their prompts
    openai_backend.py  any OpenAI-compatible endpoint (the only openai import)
    openai_wire.py     its wire: the response size cap, error classification, response parsing
    local_backend.py   a local transformers model
    simulated.py       a simulated judge shaped like openai.AsyncOpenAI, for tests and benches
    cache.py           a content-addressed on-disk cache of responses
    factory.py         a judge from a scenario's `judges:` entry, optionally calibrated
    reward_model.py    a trained reward model (marl rm train) as a scorer and a pairwise judge
    gguf_source.py     where a GGUF model (a .gguf file, a packaged model's name) lies; no torch

May import: common (chat rendering), judges' top, judges.stats (calibration, Dawid-Skene) inside functions.
"""
