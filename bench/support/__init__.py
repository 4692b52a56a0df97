"""Shared parts of the benches (not benches themselves: bench/*.py are, and each runs with --quick in the tests).

    real_model.py   a randomly initialised Qwen2 model with a byte-level BPE tokenizer trained locally,
                    its ~100-token ChatML prompts, and process peak-memory readings
    runtime.py      the set-up of the training benches: one torch thread, quiet libraries
"""
