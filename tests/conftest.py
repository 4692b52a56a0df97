"""Shared fixtures: a micro random policy (instant), the real warmed-up demo model (built once), and
small random models of real architectures with a BPE tokenizer and a chat template."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session", autouse=True)
def _one_thread():
    import torch

    torch.set_num_threads(1)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


@pytest.fixture
def micro_policy():
    """Factory of a fresh, seeded, untrained micro Llama (2 layers, hidden 32) and its char tokenizer."""
    from helpers.char_model import micro_char_llama

    return micro_char_llama


@pytest.fixture(scope="session")
def addition():
    from marl.addition import addition_splits

    return addition_splits(seed=0)


@pytest.fixture(scope="session")
def demo_model_dir(addition):
    """The default tiny model, SFT-warmed (built on first use, ~1 min, then cached on disk)."""
    from trainers.demo import demo_policy

    return demo_policy(addition, log=lambda message: None)


@pytest.fixture(scope="session")
def real_model_dirs(tmp_path_factory):
    """architecture -> a saved random Qwen2 / Llama / GPT-2 directory with a BPE tokenizer and ChatML
    template (tests/helpers/real_models.py; built once per session, a second or so each)."""
    from helpers.real_models import ARCHITECTURES, build_bpe_tokenizer, build_model_dir

    root, tokenizer = tmp_path_factory.mktemp("real_models"), build_bpe_tokenizer()
    return {arch: build_model_dir(arch, root / arch, tokenizer=tokenizer) for arch in ARCHITECTURES}
