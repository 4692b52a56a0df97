"""Models and how they speak: loading, GGUF files, sampling, actors, LoRA adapters.

    tinylm.py      the embedded default model, built and cached on this machine
    addition_model.py  the tiny addition model (`marl demo` trains it; relay's agents play it)
    accuracy.py    held-out accuracy of one policy on a task set (greedy or sampled)
    loading.py     load_policy on a device and dtype (train.device, train.dtype), and placing actors there
    prompts.py     an agent's turn as a prompt: the chat template (role = system, observation = user) or plain text
    generation.py  batched token sampling with a shared-prefix KV cache, and the logprobs GRPO trains on
    actors.py      who speaks for each agent: language-model, scripted and endpoint actors
    adapters.py    LoRA via peft: one frozen base, an adapter per trained policy; saved adapters, merging

May import: common (chat rendering, atomic directories), marl, judges.model (the local backend), trainers.records, trainers.engine (an actor's rollout engine).
"""
