"""Tic-tac-toe: the referee, the scorer, a perfect (minimax) player and a random one.

The board is shown with each free cell's number, so a move is the digit the player sees:

    X2O
    4X6
    78O

Players `x` (moves first) and `o` alternate; a move is the first digit 1-9 of the message. A message
with no digit, or naming a taken cell, is an illegal move: its player loses at once (the referee says
so, and the game is over). Three in a row wins; a full board with no line is a draw.

Score (rule-verified, `outcome_score`): 1 for a player who did not lose (a win, a draw, or the other's
illegal move), 0 for a loss (an illegal move is one). The scenario is competitive, so rewards are
zero-sum: a win is +0.5, a loss -0.5, a draw 0 for both.

`best_moves` are the perfect moves of a position (minimax; a quicker win, or a slower loss, is worth
more). `minimax_move` plays the lowest-numbered one; the expert picks one per task and position, so
its games vary. Both never lose, from either seat (tests/marl/scenario/test_tictactoe.py plays them
against every legal reply).
"""

from __future__ import annotations

import functools
import random
import re

LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))
MARKS = {"x": "X", "o": "O"}
_DIGIT = re.compile(r"[1-9]")


def generate_tasks(seed: int, count: int) -> list[dict]:
    """`count` games from the empty board (the game has one start; ids tell the plays apart)."""
    return [{"id": f"tictactoe-{seed}-{index}", "prompt": "Tic-tac-toe: three in a row wins.", "metadata": {}}
            for index in range(count)]


def move_of(text: str) -> int | None:
    """The cell (0-8) a message names: its first digit 1-9; None when it has none."""
    found = _DIGIT.search(text or "")
    return int(found.group()) - 1 if found else None


def winner(board: str) -> str | None:
    """'X' or 'O' when that mark has three in a row, else None."""
    for a, b, c in LINES:
        if board[a] != "." and board[a] == board[b] == board[c]:
            return board[a]
    return None


def render(board: str) -> str:
    """Three rows, each free cell shown as its number (1-9)."""
    cells = [mark if mark != "." else str(index + 1) for index, mark in enumerate(board)]
    return "\n".join("".join(cells[row * 3:row * 3 + 3]) for row in range(3))


def play(transcript) -> dict:
    """Replay the moves: {board, over, result ('x', 'o', 'draw' or None), verdict}."""
    board, to_move = "." * 9, "x"
    for turn in transcript:
        player = turn["agent"]
        if player != to_move:
            continue  # not this player's turn (the scenario's order keeps x, o alternating)
        cell = move_of(turn["text"])
        if cell is None or board[cell] != ".":
            why = "no digit 1-9" if cell is None else f"cell {cell + 1} is taken"
            other = "o" if player == "x" else "x"
            return {"board": board, "over": True, "result": other,
                    "verdict": f"{player} made an illegal move ({why}): {other} wins"}
        board = board[:cell] + MARKS[player] + board[cell + 1:]
        if winner(board) is not None:
            return {"board": board, "over": True, "result": player, "verdict": f"{player} plays {cell + 1} and wins"}
        if "." not in board:
            return {"board": board, "over": True, "result": "draw", "verdict": f"{player} plays {cell + 1}: a draw"}
        to_move = "o" if player == "x" else "x"
    return {"board": board, "over": False, "result": None, "verdict": ""}


def referee(task, transcript) -> dict:
    """The scenario's referee: the board as {state}, whether the game is over, and the verdict."""
    game = play(transcript)
    return {"state": render(game["board"]), "over": game["over"], "verdict": game["verdict"]}


def outcome_score(item, candidate) -> float:
    """1 when the candidate player did not lose, else 0 (see the module docstring). The moves are read
    inside `candidate_input`: text no parser survives is the players' own score, never a mask."""
    from judges.types import candidate_input

    with candidate_input("the moves"):
        game = play(candidate.transcript)
    return 0.0 if game["result"] not in (None, "draw", candidate.agent) else 1.0


@functools.lru_cache(maxsize=None)
def _value(board: str, mark: str) -> int:
    """The game value for `mark` to move on `board` with perfect play: 0 a draw, else +-(1 + the free
    cells left when the game is won), so a quicker win (or a slower loss) is worth more."""
    other = "O" if mark == "X" else "X"
    if winner(board) is not None:
        return -(1 + board.count("."))  # the previous move (the other mark's) won; sooner weighs more
    if "." not in board:
        return 0
    return max(-_value(board[:i] + mark + board[i + 1:], other) for i in range(9) if board[i] == ".")


def best_moves(board: str, mark: str) -> list[int]:
    """Every perfect move (0-8) for `mark` ('X' or 'O') on `board` ('.' for free cells), lowest first."""
    other = "O" if mark == "X" else "X"
    values = {i: -_value(board[:i] + mark + board[i + 1:], other) for i in range(9) if board[i] == "."}
    best = max(values.values())
    return [i for i, value in values.items() if value == best]


def minimax_move(board: str, mark: str) -> int:
    """The perfect move (0-8) for `mark` on `board`: the lowest-numbered of `best_moves`."""
    return best_moves(board, mark)[0]


def board_of(observation: str) -> str:
    """The board ('.' for free cells) from an observation's three rows of the rendered board."""
    rows = [line.strip() for line in observation.splitlines() if re.fullmatch(r"[XO1-9]{3}", line.strip())]
    cells = "".join(rows[-3:])
    return "".join("." if ch.isdigit() else ch for ch in cells)


def expert(agent: str, observation: str, task) -> str:
    """A perfect move as a digit: one of `best_moves`, chosen by a generator seeded with the task and
    the position, so the expert never loses and its games differ from task to task (its
    demonstrations cover many positions, not one line of play)."""
    board = board_of(observation)
    return str(random.Random(f"{task.id}:{board}").choice(best_moves(board, MARKS[agent])) + 1)


def random_player(agent: str, observation: str, task) -> str:
    """A uniformly random legal move, seeded by the position (a fixed opponent for evaluation)."""
    board = board_of(observation)
    free = [i for i in range(9) if board[i] == "."]
    return str(random.Random(f"{task.id}:{board}").choice(free) + 1) if free else "1"


def heuristic_player(agent: str, observation: str, task) -> str:
    """A one-ply heuristic that knows no game tree (a warm-up expert that is not optimal): complete a
    row of its own, else block one of the other's, else a random free cell (seeded by the position)."""
    board, mark = board_of(observation), MARKS[agent]
    other = "O" if mark == "X" else "X"
    free = [i for i in range(9) if board[i] == "."]
    if not free:
        return "1"
    for who in (mark, other):  # a win first, then a block
        for i in free:
            if winner(board[:i] + who + board[i + 1:]) == who:
                return str(i + 1)
    return str(random.Random(f"{task.id}:{board}").choice(free) + 1)
