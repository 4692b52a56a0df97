"""The tic-tac-toe scenario: an exact referee, a minimax player that never loses, and the env's referee
hook ({state}, the game ending at a win, a draw or an illegal move, the verdict in the transcript)."""

from __future__ import annotations

import pytest

from helpers.paths import SCENARIOS
from marl.env import make_env
from marl.scenario.load import load_scenario, resolve_callable


@pytest.fixture(scope="module")
def lib():
    return resolve_callable("tictactoe_lib:play", SCENARIOS).__globals__  # the module's namespace


def _outcomes(lib, mark: str) -> dict[str, int]:
    """Every game a perfect player (`mark`, any of its best moves) can be drawn into, the other side
    trying every legal reply."""
    counts = {"win": 0, "draw": 0, "loss": 0}

    def explore(board: str, to_move: str) -> None:
        won = lib["winner"](board)
        if won is not None or "." not in board:
            counts["draw" if won is None else "win" if won == mark else "loss"] += 1
            return
        other = "O" if to_move == "X" else "X"
        cells = lib["best_moves"](board, to_move) if to_move == mark else \
            [i for i in range(9) if board[i] == "."]  # every perfect move of ours, every legal reply
        for cell in cells:
            explore(board[:cell] + to_move + board[cell + 1:], other)

    explore("." * 9, "X")
    return counts


@pytest.mark.parametrize("mark", ["X", "O"])
def test_minimax_never_loses_from_either_seat_against_every_reply(lib, mark):
    counts = _outcomes(lib, mark)
    assert counts["loss"] == 0 and counts["win"] > 0 and counts["draw"] > 0


def test_minimax_takes_a_win_and_blocks_a_loss(lib):
    assert lib["minimax_move"]("XX.OO....", "X") == 2  # complete the row
    assert lib["minimax_move"]("XX.O.....", "O") == 2  # block it
    assert lib["minimax_move"]("XX.OO....", "O") == 5  # O to move wins first



def test_the_heuristic_warm_up_player_wins_or_blocks_one_ply_and_is_not_optimal(lib):
    """heuristic_player, a warm-up expert that uses no optimal player (issue 32, item 1)."""
    task = make_env("tictactoe").tasks[0]
    shown = lambda board: lib["render"](board)  # noqa: E731 - the observation is the rendered board
    assert lib["heuristic_player"]("x", shown("XX.OO...."), task) == "3"  # its own row first
    assert lib["heuristic_player"]("o", shown("XX.O....."), task) == "3"  # else block
    assert lib["heuristic_player"]("o", shown("XX.OO...."), task) == "6"  # a win beats a block
    # one ply only: with no row to complete or block it moves at random, which loses to a coming fork
    imperfect = [board for board in ("X...O...X", "X.......X", ".X.X.....")
                 if int(lib["heuristic_player"]("o", shown(board), task)) - 1 not in lib["best_moves"](board, "O")]
    assert imperfect

def _play(messages: list[str]):
    env = make_env("tictactoe")
    observations, infos = env.reset(seed=0)
    seen = [observations["x"]["text"]]
    rewards = {}
    for index, text in enumerate(messages):
        mover = "x" if index % 2 == 0 else "o"
        observations, rewards, terminations, _, infos = env.step({mover: {"text": text}})
        if not env.agents:
            break
        seen.append(observations["o" if mover == "x" else "x"]["text"])
    return env, seen, rewards, infos


def test_the_board_is_the_observation_and_three_in_a_row_wins():
    env, seen, rewards, infos = _play(["5", "1", "9", "3", "2", "7", "8"])  # x: 5 9 2 8 -> 2-5-8 column
    assert seen[0] == "123\n456\n789" and seen[1] == "123\n4X6\n789" and seen[2] == "O23\n4X6\n789"
    assert rewards == {"x": 0.5, "o": -0.5}
    assert env.transcript[-1]["referee"] == "x plays 8 and wins" and infos["x"]["referee"]["over"]


@pytest.mark.parametrize("messages, verdict, rewards", [
    (["5", "5"], "o made an illegal move (cell 5 is taken): x wins", {"x": 0.5, "o": -0.5}),
    (["5", "pass"], "o made an illegal move (no digit 1-9): x wins", {"x": 0.5, "o": -0.5}),
    (["", "5"], "x made an illegal move (no digit 1-9): o wins", {"x": -0.5, "o": 0.5}),  # a forfeit is a loss
    (["5", "1", "9", "3", "2", "8", "7", "4", "6"], "x plays 6: a draw", {"x": 0.0, "o": 0.0}),
])
def test_illegal_moves_lose_and_a_full_board_is_a_draw(messages, verdict, rewards):
    env, _, got, infos = _play(messages)
    assert env.transcript[-1]["referee"] == verdict and got == rewards and not env.agents
    assert infos["o"]["referee"]["verdict"] == verdict


def test_the_expert_draws_itself_and_beats_the_random_player():
    from marl.policies import get_policy, rollout

    scenario = load_scenario("tictactoe")
    env, expert = make_env(scenario), get_policy("expert", scenario)
    random_player = get_policy("tictactoe_lib:random_player", scenario)
    task = scenario.split()[1][0]
    assert rollout(env, expert, task=task).rewards == {"x": 0.0, "o": 0.0}  # perfect play is a draw
    wins = 0
    for seat in ("x", "o"):
        def mixed(agent, observation, task, seat=seat):
            return (expert if agent == seat else random_player)(agent, observation, task)
        for index, game in enumerate(scenario.split()[1][:10]):
            result = rollout(env, mixed, task=game, seed=index)
            assert result.rewards[seat] >= 0.0  # the expert never loses
            wins += result.rewards[seat] > 0
    assert wins >= 10  # and beats a random player most of the time


def test_a_state_field_without_a_referee_is_a_located_problem(tmp_path):
    from marl.scenario.load import ScenarioError

    text = (SCENARIOS / "tictactoe.yaml").read_text().replace("referee: tictactoe_lib:referee\n", "")
    (tmp_path / "tictactoe_lib.py").write_text((SCENARIOS / "tictactoe_lib.py").read_text())
    (tmp_path / "game.yaml").write_text(text)
    with pytest.raises(ScenarioError, match=r"game.yaml:\d+:\d+: agents.0.observation: \{state\} is a game's state"):
        load_scenario(tmp_path / "game.yaml")


def test_a_referee_that_raises_is_named_in_one_line(tmp_path):
    (tmp_path / "tictactoe_lib.py").write_text((SCENARIOS / "tictactoe_lib.py").read_text()
                                               + "\n\ndef broken(task, transcript):\n    raise KeyError('board')\n")
    (tmp_path / "game.yaml").write_text((SCENARIOS / "tictactoe.yaml").read_text()
                                        .replace("referee: tictactoe_lib:referee", "referee: tictactoe_lib:broken"))
    with pytest.raises(RuntimeError, match=r"^referee tictactoe_lib:broken raised KeyError: 'board'$"):
        make_env(tmp_path / "game.yaml").reset(seed=0)


@pytest.mark.parametrize("learner, not_lost_vs_minimax", [("expert", 1.0), ("'null'", 0.0)])
def test_the_evaluation_plays_every_seat_against_the_fixed_opponents(learner, not_lost_vs_minimax):
    from marl.rollout import EpisodePlayer
    from trainers.policy.actors import build_actors
    from trainers.team.evaluation import evaluate_team

    scenario = load_scenario("tictactoe", [f"agents.0.policy={learner}", f"agents.1.policy={learner}"])
    player = EpisodePlayer(scenario, *build_actors(scenario, None, seed=0))
    figures = evaluate_team(player, scenario.split()[1][:6])
    for seat in ("x", "o"):
        assert figures[f"vs/minimax/{seat}/not_lost"] == not_lost_vs_minimax
    assert figures["vs/minimax/not_lost"] == not_lost_vs_minimax
    if learner == "expert":
        assert figures["vs/random/not_lost"] == 1.0 and figures["vs/random/x/reward"] > 0.25
    else:
        assert figures["vs/random/x/reward"] == -0.5  # silence is an illegal move: a loss
    assert not any(key.startswith("opponent:") for key in player.actors)  # the opponents were only lent


def test_opponents_in_a_cooperative_scenario_are_a_located_problem():
    from marl.scenario.load import ScenarioError

    with pytest.raises(ScenarioError, match="opponents are for competitive scenarios"):
        load_scenario("relay", ["opponents={minimax: expert}"])
