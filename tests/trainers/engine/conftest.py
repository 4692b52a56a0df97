"""Fixtures shared by the `marl serve` tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def micro_dir(tmp_path_factory):
    """A saved micro character model (one token per character, a context of 32 tokens)."""
    from helpers.char_model import micro_char_llama

    model, tokenizer = micro_char_llama(seed=3)
    directory = tmp_path_factory.mktemp("served") / "micro"
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory
