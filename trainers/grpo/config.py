"""`GRPOConfig`: every knob of the GRPO core in one typed, written, immutable config.

The knobs a scenario sets (name, type, default, bounds, one-line doc) are written once, torch-free, in
`marl.scenario.spec.TrainKnobs`: a scenario's `train` section holds each under its own name. A
`GRPOConfig` is those knobs plus the two `marl run` derives from the scenario (`DERIVED_KNOBS`: the steps
of every stage, the agents' longest message), both written here. It is a frozen pydantic model, checked
when made: a value outside its type or bounds is a `KnobError` naming the knob. Change a knob with
`config.model_copy(update=...)` (`with_knobs` checks the new values too); `config.model_dump()` is the
plain dict a checkpoint and the tracker record.
"""

from __future__ import annotations

from pydantic import Field, ValidationError

from marl.scenario.spec import DERIVED_KNOBS, TrainKnobs

__all__ = ["DERIVED_KNOBS", "GRPOConfig", "KnobError", "check_knobs", "knob_docs"]


class KnobError(ValueError):
    """A GRPO knob outside its type or bounds; `knob` names it, str() is one line."""

    def __init__(self, knob: str, message: str):
        super().__init__(message)
        self.knob = knob


class GRPOConfig(TrainKnobs):
    """Every knob of the GRPO core: the scenario's (TrainKnobs) and the two derived ones, checked when made."""

    steps: int = Field(30, ge=1, description="optimizer steps of the run (each plays prompts_per_step x "
                                              "group_size completions)")
    max_new_tokens: int = Field(8, ge=1, description="longest completion; rows stop at EOS before that")

    def __init__(self, **knobs):
        try:
            super().__init__(**knobs)
        except ValidationError as error:  # one line naming the knob, not pydantic's report
            raise _knob_error(error, knobs) from None

    def with_knobs(self, **knobs) -> GRPOConfig:
        """A copy with `knobs` changed, checked like a new config (KnobError naming a bad one)."""
        return GRPOConfig(**{**self.model_dump(), **knobs})


def _knob_error(error: ValidationError, values: dict) -> KnobError:
    """The KnobError of the first problem pydantic found in `values`."""
    first = error.errors()[0]
    knob = str(first["loc"][0]) if first["loc"] else ""
    name = ".".join(str(part) for part in first["loc"])
    where = f"{name}={values.get(knob)!r}: " if knob else ""  # a check across knobs names them itself
    return KnobError(knob, f"GRPOConfig: {where}{first['msg'].removeprefix('Value error, ')}")


def check_knobs(values: dict) -> None:
    """Every knob in `values` within GRPOConfig's types and bounds; KnobError naming the first bad one."""
    GRPOConfig(**values)


def knob_docs() -> dict[str, str]:
    """Each GRPOConfig field's one-line doc, by name."""
    return {name: info.description or "" for name, info in GRPOConfig.model_fields.items()}

