"""A model judge inside a scenario's reward spec: scored through a real loopback endpoint, calibrated,
and masked (never 0) when the endpoint fails."""

import math

import pytest
import yaml

from helpers.judge_server import JudgeServer
from judges.stats.calibration import PlattCalibrator
from judges.model.factory import build_judge
from marl.env import make_env
from marl.scenario.load import ScenarioError, load_scenario


def _scenario(tmp_path, url, **judge):
    spec = {
        "name": "judged", "agents": [{"name": "writer"}],
        "tasks": {"inline": [{"prompt": "Write a haiku about rain."}]},
        "judges": [{"name": "critic", "backend": "openai", "model": "judge-model", "base_url": url,
                    "api_key_env": "NO_SUCH_KEY", "timeout_s": 5, **judge}],
        "rewards": {"answer_from": "writer", "outcome": [{"kind": "critic"}]},
    }
    path = tmp_path / "judged.yaml"
    path.write_text(yaml.safe_dump(spec))
    return load_scenario(path)


def _reward(scenario):
    env = make_env(scenario)
    env.reset(seed=0)
    _, rewards, _, _, infos = env.step({"writer": {"text": "Rain taps the window."}})
    return rewards["writer"], infos["writer"]["reward_breakdown"]["team"]


def test_a_pointwise_judge_scores_a_reward_layer(tmp_path):
    with JudgeServer(default=("ok", "Vivid and on topic. Rating: [[8]]")) as server:
        reward, breakdown = _reward(_scenario(tmp_path, server.url))
    assert reward == pytest.approx(7 / 9)
    assert breakdown["components"][0]["kind"] == "critic" and breakdown["components"][0]["status"] == "ok"


def test_a_failing_judge_masks_the_reward(tmp_path):
    with JudgeServer([("status", 400)], default=("status", 400)) as server:
        reward, breakdown = _reward(_scenario(tmp_path, server.url))
    assert math.isnan(reward) and breakdown["components"][0]["status"] == "api_error"


def test_a_calibration_applies_only_to_its_own_judge(tmp_path):
    with JudgeServer(default=("ok", "Rating: [[8]]")) as server:
        config = _scenario(tmp_path, server.url).spec.judges[0].model_dump()
        judge = build_judge(config)
        calibrator = PlattCalibrator().fit([0.2, 0.4, 0.6, 0.8] * 10, [0, 0, 1, 1] * 9 + [1, 0, 0, 1],
                                           judge_id=judge.identity)
        calibrator.save(tmp_path / "cal.json")
        reward, breakdown = _reward(_scenario(tmp_path, server.url, calibration="cal.json"))
        assert reward == pytest.approx(float(calibrator.apply([7 / 9], judge_id=judge.identity)[0]))
        other = PlattCalibrator().fit([0.2, 0.8] * 10, [0, 1] * 9 + [1, 0], judge_id="another judge")
        other.save(tmp_path / "other.json")
        with pytest.raises(ValueError, match="refuses to calibrate"):
            make_env(_scenario(tmp_path, server.url, calibration="other.json"))


def test_judge_use_is_checked_when_the_scenario_loads(tmp_path):
    with pytest.raises(ScenarioError, match="needs mode 'pointwise'"):
        _scenario(tmp_path, "http://127.0.0.1:1/v1", mode="pairwise")
    with pytest.raises(ScenarioError, match="not found next to the scenario"):
        _scenario(tmp_path, "http://127.0.0.1:1/v1", calibration="missing.json")
