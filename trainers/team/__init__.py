"""Team training: many agents, one GRPO core per trainable policy.

    trainer.py     MultiAgentTrainer: play -> score -> credit -> guards -> advantages -> update;
                   what a step played is `trainer.last_step` (a StepResult)
    metrics.py     team success, wins, masked episodes, the metrics of one step, and TurnGuards (truncated
                   prompts, completions at their limit, tool calls that never fire: a metric and one warning)
    evaluation.py  the team's held-out set at temperature 0, and its metrics
    budgets.py     the thinking-budget curve: the held-out set at several per-turn token budgets

May import: marl (rollout, credit, scenario), trainers.grpo, trainers.policy, trainers.records, common (atomic files).
"""
