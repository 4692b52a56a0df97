"""`GRPOConfig`: every knob of the GRPO core in one typed config, built from the one knob schema.

The knobs (name, type, default, bounds, one-line doc) are defined once, torch-free, in
`marl.scenario.spec.GRPOKnobs`; this module turns them into a plain dataclass the trainers read
(`config.lr`, `asdict(config)`), checked against the same schema when it is made. A scenario's
`train` section sets every knob under its own name but the derived ones (`DERIVED_KNOBS`: total
`steps` over the stages, `max_new_tokens` from the agents); see `trainers.run.grpo_config`.
"""

from __future__ import annotations

import dataclasses

from pydantic import ValidationError

from marl.scenario.spec import DERIVED_KNOBS, GRPOKnobs

__all__ = ["DERIVED_KNOBS", "GRPOConfig", "GRPOKnobs", "KnobError", "check_knobs", "knob_docs"]


class KnobError(ValueError):
    """A GRPO knob outside its type or bounds; `knob` names it, str() is one line."""

    def __init__(self, knob: str, message: str):
        super().__init__(message)
        self.knob = knob


def check_knobs(values: dict) -> None:
    """Every knob in `values` within GRPOKnobs' type and bounds; KnobError naming the first bad one."""
    try:
        GRPOKnobs.model_validate(values)
    except ValidationError as error:
        first = error.errors()[0]
        knob = str(first["loc"][0]) if first["loc"] else ""
        name = ".".join(str(part) for part in first["loc"])
        where = f"{name}={values.get(knob)!r}: " if knob else ""  # a check across knobs names them itself
        raise KnobError(knob, f"GRPOConfig: {where}{first['msg'].removeprefix('Value error, ')}") from None


def _check(config) -> None:
    """GRPOConfig.__post_init__: the knobs are checked against their one schema."""
    check_knobs({f.name: getattr(config, f.name) for f in dataclasses.fields(config)})


def _fields() -> list[tuple]:
    """(name, type, field) for make_dataclass: each knob's default and one-line doc from GRPOKnobs."""
    return [(name, info.annotation, dataclasses.field(default=info.default, metadata={"doc": info.description}))
            for name, info in GRPOKnobs.model_fields.items()]


GRPOConfig = dataclasses.make_dataclass(
    "GRPOConfig", _fields(),
    namespace={"__module__": __name__, "__post_init__": _check, "__doc__": "Every knob of the GRPO core (fields and defaults: "
                                                  "marl.scenario.spec.GRPOKnobs), checked when made."})


def knob_docs() -> dict[str, str]:
    """Each GRPOConfig field's one-line doc, by name."""
    return {f.name: f.metadata["doc"] for f in dataclasses.fields(GRPOConfig)}
