"""Reward models: preference pairs and Bradley-Terry training (`marl rm train`).

    pairs.py          the {prompt, chosen, rejected} JSONL file (FILE:LINE errors) and the held-out split
    bradley_terry.py  the training loop, readable top to bottom: loss, model, data, evaluation, steps

Scoring with a trained reward model is judges.model.reward_model (the `reward_model` judge kind), which
also owns the rendering both sides share.

May import: common (atomic writes, model-directory checks), judges (the reward-model judge's rendering
and fingerprints), trainers.records (tracking). torch and transformers at the top of bradley_terry.py only;
pairs.py is torch-free.
"""
