"""The set-up every training bench makes before its runs: one torch thread, quiet libraries."""

from __future__ import annotations


def one_quiet_thread() -> None:
    """One torch thread (usually fastest on a small shared CPU box, and the same for every condition)
    and no library chatter (transformers, tokenizers) between a bench's own lines."""
    import torch

    from trainers.cli.common import quiet_libraries

    quiet_libraries()
    torch.set_num_threads(1)
