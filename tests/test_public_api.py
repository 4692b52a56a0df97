"""The public surface: each package's top names a few objects (PEP 562, imported on first use), so moving
a module never breaks a user's import; importing the packages still loads nothing heavy."""

import importlib
import subprocess
import sys

import pytest

HEAVY = ("torch", "transformers", "wandb", "openai")
# the names each package promises; a name once public stays public (more may be added)
PROMISED = {
    "marl": {"make_env", "make_aec_env", "ScenarioEnv", "load_scenario", "Scenario", "ScenarioError", "Task",
             "scenario_conformance"},
    "marl.credit": {"shapley", "banzhaf", "owen", "myerson", "difference_rewards", "least_core", "CreditEstimate"},
    "judges": {"report", "calibrate", "read_items", "write_report", "simulated_judge", "CalibrationResult",
               "WorkflowError", "ReportItem", "build_judge", "PairwiseJudge", "Item", "Candidate", "Judgment"},
    "trainers": {"GRPOConfig", "group_advantages", "demo_options", "run_demo", "run_scenario", "RunOptions",
                 "resolve_config", "TrainConfig", "MultiAgentTrainer", "StepPlan"},
    "trainers.grpo": {"GRPOConfig", "group_advantages", "policy_loss", "zero_std_group_fraction"},
}
PACKAGES = sorted(PROMISED)


def _public(package_name: str) -> list[tuple[str, str, str]]:
    """(name, module, attribute) of every public name of the package, from its mapping."""
    package = importlib.import_module(package_name)
    return [(name, *target.split(":")) for name, target in package._PUBLIC.items()]


@pytest.mark.parametrize("package_name", PACKAGES)
def test_all_lists_the_promised_names_and_each_resolves_to_its_mapped_object(package_name):
    package = importlib.import_module(package_name)
    assert PROMISED[package_name] <= set(package.__all__), PROMISED[package_name] - set(package.__all__)
    assert sorted(package.__all__) == sorted(package._PUBLIC)
    for name, module_name, attribute in _public(package_name):
        target = getattr(importlib.import_module(module_name), attribute)
        assert getattr(package, name) is target, f"{package_name}.{name} is not {module_name}:{attribute}"
        # the mapping names where the object is defined, not a module that happens to import it
        assert getattr(target, "__module__", module_name) == module_name, (name, target.__module__)


@pytest.mark.parametrize("package_name", PACKAGES)
def test_dir_lists_the_public_names_and_from_import_works(package_name):
    package = importlib.import_module(package_name)
    assert set(package.__all__) <= set(dir(package))
    namespace: dict = {}
    exec(f"from {package_name} import *", namespace)  # noqa: S102  (star-import honours __all__)
    assert set(package.__all__) <= set(namespace)


@pytest.mark.parametrize("package_name", PACKAGES)
def test_an_unknown_name_is_an_attribute_error_naming_the_package(package_name):
    package = importlib.import_module(package_name)
    with pytest.raises(AttributeError, match=rf"^module '{package_name}' has no attribute 'no_such_name'$"):
        package.no_such_name  # noqa: B018
    assert not hasattr(package, "no_such_name")
    with pytest.raises(ImportError):
        exec(f"from {package_name} import no_such_name", {})  # noqa: S102


def test_submodules_still_import_through_the_lazy_top():
    from marl.credit import estimators
    from trainers.grpo import objective

    assert estimators.shapley.__module__ == "marl.credit.estimators" and objective.__name__ == "trainers.grpo.objective"


def test_importing_the_packages_and_their_torch_free_names_loads_no_heavy_library():
    """The packages (and dir(), __all__) load nothing; nor do the torch-free names a user reaches first."""
    code = ("import sys, marl, marl.credit, judges, trainers, trainers.grpo\n"
            "for p in (marl, marl.credit, judges, trainers, trainers.grpo): dir(p); p.__all__\n"
            "marl.credit.shapley, marl.load_scenario, judges.report, judges.calibrate, judges.read_items\n"
            "print(' '.join(sorted(sys.modules)))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert not {name for name in loaded if name.split(".")[0] in HEAVY}


def test_the_names_lost_in_the_last_move_work_again():
    """`marl.credit.shapley` and `trainers.grpo.group_advantages` were importable before the move into rooms."""
    import marl.credit
    import trainers.grpo
    from marl.credit import shapley
    from trainers.grpo import group_advantages

    glove = lambda s: min(len(s & {"L"}), len(s & {"R1", "R2"}))  # noqa: E731
    credit = marl.credit.shapley(glove, ["L", "R1", "R2"])
    assert shapley is marl.credit.shapley
    assert credit.values == pytest.approx({"L": 2 / 3, "R1": 1 / 6, "R2": 1 / 6})
    advantages = trainers.grpo.group_advantages([1.0, 0.0, 0.5, 0.5], group_size=2).tolist()
    assert group_advantages is trainers.grpo.group_advantages
    assert advantages[0] > 0 > advantages[1] and advantages[0] == pytest.approx(-advantages[1])
    assert advantages[2:] == [0.0, 0.0]  # a group without spread carries no signal
