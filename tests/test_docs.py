"""The docs site: generated pages are fresh, the site builds in strict mode, every Python example runs, every
scenario example validates, and every metric a real step logs is documented (docs/development.md, "The docs
site")."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers.paths import ROOT

from judges.workflows import SIM_BIASES
from marl.scenario.load import load_scenario
from trainers.cli.docs import metrics
from trainers.cli.docs.generate import pages, stale_pages

PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
NO_RUN = "<!-- no-run"  # a line starting so, right before a fence, keeps that block out of the test (say why)
EXAMPLE_RUN = "runs/example"  # what docs/runs.md reads: a real two-step relay run, made by the fixture below
RUN_SETTINGS = ["train.steps=2", "train.prompts_per_step=2", "train.group_size=4", "tasks.count=60",
                "tasks.eval_count=8", "train.warmup.rl_steps=0", "train.eval_every=1", "agents.0.policy=own"]
ENV = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1",
       "OMP_NUM_THREADS": "1"}


def blocks(page: Path, language: str) -> list[tuple[int, str, bool]]:
    """(line, code, runs) of every fenced block of `language` on a page; `runs` is False after a no-run line."""
    found, lines = [], page.read_text(encoding="utf-8").splitlines()
    index = 0
    while index < len(lines):
        if lines[index].strip() == f"```{language}":
            start = index
            index += 1
            while lines[index].strip() != "```":
                index += 1
            before = next((line for line in reversed(lines[:start]) if line.strip()), "")
            found.append((start + 1, "\n".join(lines[start + 1:index]), not before.strip().startswith(NO_RUN)))
        index += 1
    return found


def _name(page: Path) -> str:
    return str(page.relative_to(ROOT))


def _needs_run(page: Path) -> bool:
    return any(EXAMPLE_RUN in code for _, code, runs in blocks(page, "python") if runs)


def _run_examples(page: Path, cwd: Path) -> None:
    """Run the page's runnable Python blocks in order, in one namespace, in a fresh interpreter in `cwd`."""
    runnable = [(line, code) for line, code, runs in blocks(page, "python") if runs]
    script = "namespace = {'__name__': '__main__'}\n" + "".join(
        f"exec(compile({code!r}, {f'{_name(page)}:{line}'!r}, 'exec'), namespace)\n" for line, code in runnable)
    done = subprocess.run([sys.executable, "-c", script], cwd=cwd, env=ENV, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, f"an example of {_name(page)} failed:\n{done.stderr[-4000:]}"


# -- the generated pages and the site --------------------------------------------------------------------------
def test_the_generated_reference_pages_are_fresh():
    stale = stale_pages(ROOT)
    assert stale == [], f"stale generated pages {[str(p) for p in stale]}: run `make docs-gen` and commit them"


def test_the_generator_is_deterministic_and_writes_no_path_of_this_machine():
    first, second = pages(), pages()
    assert first == second
    for text in first.values():
        assert str(ROOT) not in text and str(Path.home()) not in text


def test_a_stale_page_is_found(tmp_path):
    (tmp_path / "docs" / "reference").mkdir(parents=True)
    for relative, text in pages().items():
        (tmp_path / relative).write_text(text)
    assert stale_pages(tmp_path) == []
    first = sorted(pages())[0]
    (tmp_path / first).write_text((tmp_path / first).read_text() + "edited by hand\n")
    assert stale_pages(tmp_path) == [first]


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None,
                    reason="mkdocs is not installed: `make install` installs the docs extra (pip install -e '.[docs]')")
def test_the_site_builds_in_strict_mode(tmp_path):
    """Broken links and anchors, pages missing from the nav and unknown files fail the build."""
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    assert (tmp_path / "site" / "reference" / "scenario-file" / "index.html").is_file()


# -- the examples ----------------------------------------------------------------------------------------------
EXAMPLE_PAGES = [page for page in PAGES if any(runs for _, _, runs in blocks(page, "python"))]


@pytest.mark.parametrize("page", [p for p in EXAMPLE_PAGES if not _needs_run(p)], ids=_name)
def test_the_python_examples_run(page, tmp_path):
    _run_examples(page, tmp_path)


def test_few_examples_are_kept_out():
    kept_out = [(_name(page), line) for page in PAGES for line, _, runs in blocks(page, "python") if not runs]
    assert len(kept_out) <= 4, kept_out
    assert len(EXAMPLE_PAGES) >= 5


def test_every_scenario_in_the_docs_validates(tmp_path):
    """A ```yaml block that is a whole scenario file (name, agents, tasks, rewards) loads without a problem."""
    full = []
    for page in PAGES:
        for line, code, _ in blocks(page, "yaml"):
            data = yaml.safe_load(code)
            if isinstance(data, dict) and {"name", "agents", "tasks", "rewards"} <= set(data):
                path = tmp_path / f"{page.stem}-{line}.yaml"
                path.write_text(code)
                load_scenario(str(path))
                full.append(f"{_name(page)}:{line}")
    assert any(name.startswith("README.md:") for name in full), full


# -- a real run: the examples that read it, and every metric it logs -------------------------------------------
@pytest.fixture(scope="module")
def example_run(demo_model_dir, tmp_path_factory):
    """A folder holding runs/example: relay for two steps with a W&B offline run (about 20 s)."""
    folder = tmp_path_factory.mktemp("docs")
    settings = [item for setting in RUN_SETTINGS for item in ("--set", setting)]
    done = subprocess.run([sys.executable, "-m", "trainers.cli.main", "run", "relay", *settings, "--out",
                           str(folder / EXAMPLE_RUN), "--tracker", "wandb"], cwd=ROOT, env=ENV, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return folder


@pytest.mark.xdist_group("docs_run")
@pytest.mark.parametrize("page", [p for p in EXAMPLE_PAGES if _needs_run(p)], ids=_name)
def test_the_python_examples_that_read_a_run_run(page, example_run):
    _run_examples(page, example_run)


@pytest.mark.xdist_group("docs_run")
def test_the_wandb_reader_of_the_docs_reads_what_the_run_logged(example_run, monkeypatch):
    monkeypatch.chdir(example_run)
    namespace: dict = {}
    reader = next(code for _, code, _ in blocks(ROOT / "docs" / "runs.md", "python") if "def wandb_history" in code)
    exec(compile(reader, "docs/runs.md", "exec"), namespace)
    log = sorted((example_run / EXAMPLE_RUN / "wandb").glob("offline-run-*/run-*.wandb"))[-1]
    logged = [row for row in namespace["wandb_history"](log) if "train/reward" in row]
    mirror = [json.loads(line) for line in (example_run / EXAMPLE_RUN / "metrics.jsonl").read_text().splitlines()]
    mirror = [row for row in mirror if "train/reward" in row]
    assert [row["train/step"] for row in logged] == [row["train/step"] for row in mirror] == [1, 2]
    assert [row["train/reward"] for row in logged] == pytest.approx([row["train/reward"] for row in mirror])


@pytest.mark.xdist_group("docs_run")
def test_every_metric_a_run_logs_is_in_the_metrics_reference(example_run):
    rows = [json.loads(line) for line in (example_run / EXAMPLE_RUN / "metrics.jsonl").read_text().splitlines()]
    keys = {key for row in rows for key in row}
    assert {"train/reward", "policy/left/loss", "eval/team_success", "credit/left/share"} <= keys
    assert metrics.undocumented(keys) == [], "add these to trainers/cli/docs/metrics.py, then make docs-gen"
    before = json.loads((example_run / EXAMPLE_RUN / "before.json").read_text())
    assert metrics.undocumented(f"eval/{figure}" for figure in before) == []


def _written(pattern: str, code: str) -> bool:
    """Whether the code writes keys of `pattern`: its fixed start (before its first <name>), or the whole key
    (or its namespace followed by an f-string field)."""
    if "<" in pattern:
        return pattern.split("<")[0] in code
    return pattern in code or pattern.rsplit("/", 1)[0] + "/{" in code


def test_the_metrics_table_names_only_keys_the_code_writes():
    code = "\n".join(path.read_text() for folder in ("trainers", "marl") for path in (ROOT / folder).rglob("*.py")
                     if "docs" not in path.parts)
    patterns = [key for rows in metrics.STEP.values() for key, _ in rows] + [key for key, _ in metrics.REWARD_MODEL]
    patterns += [figure for figure, _ in metrics.HELD_OUT]
    assert [pattern for pattern in patterns if not _written(pattern, code)] == []
    assert metrics.undocumented(["train/reward", "policy/shared/loss", "eval/vs/minimax/x/not_lost"]) == []
    assert metrics.undocumented(["train/rewards", "nothing/here"]) == ["nothing/here", "train/rewards"]


# -- what the docs must say -------------------------------------------------------------------------------------
def test_the_readme_fits_and_carries_no_commit_hash_or_issue_number():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 300
    hashes = [word for word in re.findall(r"\b[0-9a-f]{7,40}\b", text) if re.search(r"[a-f]", word)
              and re.search(r"\d", word)]
    assert hashes == []
    assert re.findall(r"(?i)\bissue\s*#?\d+|#\d{1,4}\b", text) == []


def _anchors(page: Path) -> set[str]:
    """The anchors of a page's headings, as the site (and GitHub) make them, plus explicit `{ #name }` ones."""
    from pymdownx.slugs import slugify  # lazy: only this check needs the docs extra

    slug = slugify(case="lower")
    anchors = set()
    for line in page.read_text().splitlines():
        if line.startswith("#") and (heading := line.lstrip("#").strip()):
            if match := re.search(r"\{ #([\w-]+) \}$", heading):
                anchors.add(match.group(1))
            else:
                anchors.add(slug(heading, "-"))
    return anchors


@pytest.mark.skipif(importlib.util.find_spec("pymdownx") is None, reason="the docs extra is not installed")
def test_the_readme_links_point_at_pages_and_headings_that_exist():
    """mkdocs checks the links between docs pages; the README lies outside the site, so it is checked here."""
    broken = []
    for target in re.findall(r"\]\(((?!https?:)[^)\s]+)\)", (ROOT / "README.md").read_text()):
        path, _, anchor = target.partition("#")
        if not (ROOT / path).is_file() or anchor and anchor not in _anchors(ROOT / path):
            broken.append(target)
    assert broken == []


def _commits(text: str) -> set[str]:
    return {word for word in re.findall(r"\b[0-9a-f]{7}\b", text) if re.search(r"[a-f]", word) and re.search(r"\d", word)}


def test_every_commit_the_docs_cite_is_dated():
    """Benchmarks give each figure its date, commit and command: the commits' dates are one table."""
    benchmarks = (ROOT / "docs" / "benchmarks.md").read_text()
    dated = set(re.findall(r"^\| ([0-9a-f]{7}) \| \d{4}-\d{2}-\d{2} \|$", benchmarks, re.M))
    cited = set().union(*(_commits(page.read_text()) for page in PAGES))
    assert sorted(cited - dated) == [], "add these commits and their dates to docs/benchmarks.md's last table"


def test_the_judges_page_names_every_simulated_bias_and_backend():
    text = (ROOT / "docs" / "judges.md").read_text()
    assert [name for name in SIM_BIASES if f"`{name}`" not in text] == []
    assert all(f"`backend: {backend}`" in text or f"backend: {backend}" in text
               for backend in ("openai", "local", "reward_model", "simulated"))


def _repository_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True)
    names = listed.stdout.splitlines() if listed.returncode == 0 else []
    return [ROOT / name for name in names if name.endswith((".md", ".py", ".yaml")) and (ROOT / name).is_file()]


def test_nothing_cites_research_notes_the_repository_does_not_have():
    """The research notes the code was written from are not in the repository: cite a published source or none."""
    files = [path for path in _repository_files() if path != Path(__file__).resolve()]
    assert len(files) > 100
    pattern = re.compile(r"research[/ ](?:doc|report|notes?|credit\.md|style)")
    assert [str(path.relative_to(ROOT)) for path in files if pattern.search(path.read_text(errors="replace"))] == []
