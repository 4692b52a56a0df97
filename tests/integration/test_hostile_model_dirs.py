"""Model folders that do not load, in every command that loads one (issue 31, item 4): one line naming the
folder, what is wrong and the fix, exit status 2, no traceback, nothing written, and a pickle never
unpickled. The folders are the tests' random Llama broken as tests/helpers/bad_models.py's HOSTILE kinds
say; the commands run in this process (helpers.inprocess), one of them in a real subprocess too.

Also `marl export` into a folder it cannot write (read-only, under a file, a file, a folder of other
files): one line, and an earlier export is never lost."""

import os
import shutil

import pytest

from helpers.bad_models import HOSTILE, broken_model_dir, make_hostile, pickle_marker
from helpers.cli import one_error_line, run_marl
from helpers.inprocess import marl_in_process
from helpers.paths import ROOT
from helpers.scenario_files import GOOD

EXPECTED = {  # kind -> what its line says
    "truncated": "model.safetensors is ",
    "pickle": "its weights are pickle files (pytorch_model.bin), which marl never loads",
    "config_mismatch": "config.json does not match the weights",
    "extra_layers": "config.json does not match the weights",
    "untied_head": "config.json does not match the weights: its model has lm_head.weight",
    "failing_template": "its chat template fails to render",
    "no_tokenizer": "no tokenizer (none of tokenizer.json",
    "fifo": "tokenizer.json is a named pipe (FIFO)",
}
PAIRS = "".join(f'{{"prompt": "{i}+1=", "chosen": "{i + 1}", "rejected": "{i + 2}"}}\n' for i in range(12))


@pytest.fixture
def hostile(real_model_dirs, tmp_path):
    """kind -> the hostile folder of that kind (made on first use)."""
    made = {}

    def make(kind: str):
        if kind not in made:
            made[kind] = broken_model_dir(real_model_dirs["llama"], tmp_path / kind, kind)
        return made[kind]

    return make


def check_line(result, directory, kind: str) -> str:
    """The one error line, naming `directory` and saying what is wrong; the pickle never unpickled."""
    line = one_error_line(result)
    assert str(directory) in line and EXPECTED[kind] in line, line
    assert not pickle_marker(directory).exists()
    return line


def test_the_pickle_would_run_code_if_it_were_ever_unpickled(hostile, tmp_path):
    """The marker the tests look for is real: unpickling the folder's weights creates it."""
    import pickle

    directory = hostile("pickle")
    pickle.loads((directory / "pytorch_model.bin").read_bytes())
    assert pickle_marker(directory).exists()


@pytest.mark.parametrize("kind", HOSTILE)
def test_rollout_refuses_a_hostile_policy_folder(hostile, kind):
    directory = hostile(kind)
    check_line(marl_in_process("rollout", "relay", "--policy", directory, "--episodes", "1"), directory, kind)


@pytest.mark.parametrize("kind", ["truncated", "pickle", "no_tokenizer", "fifo"])  # what the files' headers show
def test_validate_checks_a_train_model_folder_from_its_headers(hostile, kind):
    """Torch-free and nothing loaded (the config-against-weights kinds need torch's meta device: at load)."""
    directory = hostile(kind)
    line = check_line(marl_in_process("validate", "relay", "--set", f"train.model={directory}"), directory, kind)
    assert line.startswith(f"{ROOT / 'scenarios' / 'relay.yaml'} (--set train.model):0:0: train.model: "), line


def test_validate_checks_an_agents_model_policy_folder(hostile, tmp_path):
    directory = hostile("pickle")
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(GOOD.replace("  - name: a\n", f"  - name: a\n    policy: {directory}\n"))
    line = check_line(marl_in_process("validate", scenario), directory, "pickle")
    assert line.startswith(f"{scenario}:") and ": agents.0.policy: " in line, line


@pytest.mark.parametrize("kind", HOSTILE)
def test_run_refuses_a_hostile_train_model(hostile, tmp_path, kind):
    directory = hostile(kind)
    result = marl_in_process("run", "relay", "--set", f"train.model={directory}", "--out", tmp_path / "run",
                             "--tracker", "none")
    check_line(result, directory, kind)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("kind", [kind for kind in HOSTILE if kind != "fifo"])  # a manifest cannot hash a FIFO
def test_eval_refuses_a_checkpoint_with_a_hostile_model(hostile, tmp_path, kind):
    from trainers.records.manifest import write_manifest

    checkpoint = tmp_path / "run" / "checkpoints" / "step-000001"
    shutil.copytree(hostile(kind), checkpoint / "model")
    write_manifest(checkpoint)  # as an attacker would: the manifest matches the hostile files
    result = marl_in_process("eval", "relay", "--checkpoint", checkpoint, "--tasks", "1", "--no-credit",
                             "--out", tmp_path / "out")
    check_line(result, checkpoint / "model", kind)
    assert not (tmp_path / "out").exists()


def test_eval_never_reads_a_fifo_in_a_checkpoint_model(real_model_dirs, tmp_path):
    """A checkpoint without a manifest whose model/config.json is a named pipe: checked before anything
    reads it (the context check read config.json first). A real process, so a hang fails on its timeout."""
    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(real_model_dirs["llama"], checkpoint / "model")
    (checkpoint / "model" / "config.json").unlink()
    os.mkfifo(checkpoint / "model" / "config.json")
    line = one_error_line(run_marl("eval", "relay", "--checkpoint", str(checkpoint), "--tasks", "1", "--no-credit",
                                   "--out", str(tmp_path / "out"), timeout=120))
    assert f"{checkpoint / 'model'}: config.json is a named pipe (FIFO)" in line


@pytest.mark.parametrize("kind", [kind for kind in HOSTILE if kind != "untied_head"])  # a reward model has no lm_head
def test_rm_train_refuses_a_hostile_base(hostile, tmp_path, kind):
    directory = hostile(kind)
    (tmp_path / "pairs.jsonl").write_text(PAIRS)
    result = marl_in_process("rm", "train", "--pairs", tmp_path / "pairs.jsonl", "--base", directory, "--out",
                             tmp_path / "rm", "--tracker", "none", "--epochs", "0")
    assert check_line(result, directory, kind).startswith(f"marl: error: --base {directory}: ")
    assert not (tmp_path / "rm").exists()


@pytest.mark.parametrize("kind", [kind for kind in HOSTILE if kind != "failing_template"])  # a template is text there
def test_serve_and_gguf_export_refuse_a_hostile_folder(hostile, tmp_path, kind):
    directory = hostile(kind)
    check_line(marl_in_process("serve", directory, "--port", "0"), directory, kind)
    check_line(marl_in_process("export", directory, "--gguf", "--out", tmp_path / "m.gguf"), directory, kind)
    assert not (tmp_path / "m.gguf").exists()


@pytest.mark.parametrize("kind", ["truncated", "pickle", "no_tokenizer", "fifo"])
def test_export_refuses_to_copy_a_folder_marl_would_not_load(hostile, tmp_path, kind):
    """A copy would carry it on (and a FIFO or device would make the copy wait or never end)."""
    directory = hostile(kind)
    check_line(marl_in_process("export", directory, "--out", tmp_path / "exported"), directory, kind)
    assert not (tmp_path / "exported").exists()


@pytest.mark.parametrize("kind", ["truncated", "pickle", "config_mismatch", "no_tokenizer", "fifo"])
def test_judges_report_refuses_a_hostile_reward_model(real_model_dirs, tmp_path, kind):
    """A reward model folder `marl rm train` wrote, then broken the same way."""
    (tmp_path / "pairs.jsonl").write_text(PAIRS)
    rm = tmp_path / "rm"
    assert marl_in_process("rm", "train", "--pairs", tmp_path / "pairs.jsonl", "--base", real_model_dirs["llama"],
                           "--out", rm, "--tracker", "none", "--epochs", "0").returncode == 0
    make_hostile(rm, kind)
    result = marl_in_process("judges", "report", "--reward-model", rm, "--items", "examples/judge_items.jsonl",
                             "--out", tmp_path / "reports" / "r.json")
    check_line(result, rm, kind)
    # nothing is written on failure: --out is checked without making its folder, which is made only when the
    # report is written (a config that does not fit the weights is found when the model is built, after that)
    assert not (tmp_path / "reports").exists()


def test_a_failing_template_plays_in_plain_text_with_chat_template_none(hostile):
    """The fix the line names works: the template is never rendered then."""
    result = marl_in_process("rollout", "relay", "--policy", hostile("failing_template"), "--episodes", "1",
                             "--quiet", "--set", "chat_template=none")
    assert result.returncode == 0, result.stderr


def test_a_real_process_prints_one_line_for_pickle_weights(hostile):
    """In a fresh interpreter, nothing else reaches stderr (no warning of torch's unpickler)."""
    directory = hostile("pickle")
    check_line(run_marl("rollout", "relay", "--policy", str(directory), "--episodes", "1"), directory, "pickle")


# -- export into a folder it cannot write -------------------------------------------------------------------
def test_export_into_a_read_only_folder_is_one_line(real_model_dirs, tmp_path):
    """Read-only for this user; as root (which writes anywhere) a path under a file stands in for it."""
    if os.geteuid() == 0:
        (tmp_path / "a_file").write_text("mine")
        out, expected = tmp_path / "a_file" / "sub", "is a file, not a folder"
    else:
        (tmp_path / "locked").mkdir()
        (tmp_path / "locked").chmod(0o500)
        out, expected = tmp_path / "locked" / "model", "cannot write in"
    try:
        for extra in ([], ["--gguf"]):
            line = one_error_line(marl_in_process("export", real_model_dirs["llama"], "--out", out, *extra))
            assert line.startswith(f"marl: error: --out {out}: ") and expected in line
    finally:
        if (tmp_path / "locked").exists():
            (tmp_path / "locked").chmod(0o700)
    assert not out.exists()


def test_export_never_replaces_a_file_or_a_folder_of_other_files(real_model_dirs, tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("years of work")
    for out, expected in ((tmp_path / "notes.txt", "is a file; give a folder path"),
                          (tmp_path / "mine", "holds files that are not a model")):
        line = one_error_line(marl_in_process("export", real_model_dirs["llama"], "--out", out))
        assert expected in line
    assert (tmp_path / "notes.txt").read_text() == "mine"
    assert (tmp_path / "mine" / "thesis.tex").read_text() == "years of work"


def test_a_write_that_fails_midway_keeps_the_earlier_export(real_model_dirs, tmp_path, monkeypatch):
    """A folder made read-only (or a disk filled) while the copy is written: one line, the earlier export is
    as it was, and no temporary folder is left beside it."""
    out = tmp_path / "exported"
    assert marl_in_process("export", real_model_dirs["llama"], "--out", out).returncode == 0
    before = {path.name: path.read_bytes() for path in out.iterdir()}

    def read_only(source, target, **kwargs):
        raise OSError(30, "Read-only file system", str(target))

    monkeypatch.setattr(shutil, "copytree", read_only)
    line = one_error_line(marl_in_process("export", real_model_dirs["qwen2"], "--out", out))
    assert "Read-only file system" in line and f"the earlier {out} is kept as it was" in line
    assert {path.name: path.read_bytes() for path in out.iterdir()} == before
    assert sorted(path.name for path in tmp_path.iterdir()) == ["exported"]


# -- LoRA adapter folders ------------------------------------------------------------------------------------
ADAPTER_KINDS = {  # kind -> what its line says
    "truncated": "adapter_model.safetensors is ",
    "pickle": "its weights are pickle files (adapter_model.bin), which marl never loads",
    "fifo": "marl_base.json is a named pipe (FIFO)",
    "huge_number": "marl_base.json is unreadable (Exceeds the limit (4300 digits)",
    "not_a_path": "marl_base.json names base '12345', not a directory path",
}


def hostile_adapter(base, target, kind: str):
    """A LoRA adapter saved on `base` (as a train.lora checkpoint holds it), then broken as `kind` says."""
    from marl.scenario.spec import LoraSpec
    from trainers.policy.adapters import AdapterBase
    from trainers.policy.loading import load_policy

    model, tokenizer = load_policy(base)
    AdapterBase(model, base, tokenizer).add("shared", LoraSpec(r=4, alpha=8.0)).save_pretrained(target)
    weights, record = target / "adapter_model.safetensors", target / "marl_base.json"
    if kind == "truncated":
        weights.write_bytes(weights.read_bytes()[:100])
    elif kind == "pickle":
        import pickle

        from helpers.bad_models import Touch

        weights.unlink()
        (target / "adapter_model.bin").write_bytes(pickle.dumps(Touch(pickle_marker(target))))
    elif kind == "fifo":
        record.unlink()
        os.mkfifo(record)
    elif kind == "huge_number":
        record.write_text('{"base_model_dir": "x", "base_fingerprint": ' + "9" * 5000 + "}")
    else:
        record.write_text('{"base_model_dir": 12345}')
    return target


@pytest.mark.parametrize("kind", ADAPTER_KINDS)
def test_adapter_commands_refuse_a_hostile_adapter_folder(real_model_dirs, tmp_path, kind):
    adapter = hostile_adapter(real_model_dirs["llama"], tmp_path / "adapter", kind)
    for command in (["rollout", "relay", "--policy", adapter, "--episodes", "1"],
                    ["export", adapter, "--merge", "--out", tmp_path / "merged"],
                    ["serve", adapter, "--port", "0"]):
        line = one_error_line(marl_in_process(*command))
        assert str(adapter) in line and ADAPTER_KINDS[kind] in line, (command, line)
    assert not pickle_marker(adapter).exists() and not (tmp_path / "merged").exists()


@pytest.mark.parametrize("kind", ["truncated", "pickle", "no_tokenizer", "fifo"])
def test_a_hostile_local_judge_is_one_line_before_anything_plays(hostile, tmp_path, kind):
    """A scenario's `backend: local` judge: checked (never read past its headers) before any episode."""
    import yaml

    directory = hostile(kind)
    spec = {"name": "judged", "agents": [{"name": "writer"}], "tasks": {"inline": [{"prompt": "Write a haiku."}]},
            "judges": [{"name": "critic", "backend": "local", "model": str(directory)}],
            "rewards": {"answer_from": "writer", "outcome": [{"kind": "critic"}]}}
    (tmp_path / "judged.yaml").write_text(yaml.safe_dump(spec))
    line = check_line(marl_in_process("rollout", tmp_path / "judged.yaml", "--episodes", "1"), directory, kind)
    assert line.startswith("marl: error: judges.0.model (critic): ")


def test_a_template_that_fails_only_on_some_turn_is_one_line_when_it_does():
    """The probe at load time renders one turn per agent; a template that fails later, on one observation,
    still raises ChatTemplateError (a ValueError: every command's one line), never jinja's own error."""
    from trainers.policy.prompts import ChatTemplateError, TurnStyle, template_problem, turn_prompt

    class Tokenizer:
        chat_template, name_or_path = "a template", "/models/picky"

        def apply_chat_template(self, messages, **options):
            if "boom" in messages[-1]["content"]:
                raise RuntimeError("the template cannot say boom")
            return "rendered"

    styles = {"left": TurnStyle("You add."), "right": TurnStyle(mode="none")}
    assert template_problem(Tokenizer(), styles) is None and turn_prompt(Tokenizer(), "1+2=") == "rendered"
    with pytest.raises(ChatTemplateError, match=r"^/models/picky: its chat template fails to render a turn "
                                                r"\(RuntimeError: the template cannot say boom\); fix"):
        turn_prompt(Tokenizer(), "boom", styles["left"])
    assert turn_prompt(Tokenizer(), "boom", styles["right"]) == "boom"  # chat_template: none never renders it
