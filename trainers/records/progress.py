"""Console progress for training runs: a one-line bar with step, reward, time per step and ETA."""

from __future__ import annotations

import sys
import time


class ProgressPrinter:
    """Prints `step k/N | reward | team success | stage | s/step | eta` once per step.

    On a terminal the line is redrawn in place; otherwise (CI, pipes) a line is printed every
    `every` steps so logs stay short.
    """

    def __init__(self, total: int, start: int = 0, log=print, every: int = 5):
        self.total, self.done, self.log, self.every = total, start, log, every
        self.started = time.perf_counter()
        self.first = start
        self.interactive = sys.stdout.isatty() and log is print

    def update(self, metrics: dict) -> None:
        """Report one finished step."""
        self.done += 1
        elapsed = time.perf_counter() - self.started
        per_step = elapsed / max(1, self.done - self.first)
        eta = per_step * (self.total - self.done)
        width = 24
        filled = int(width * self.done / max(1, self.total))
        line = (f"[{'#' * filled}{'.' * (width - filled)}] step {self.done}/{self.total} | "
                f"reward {metrics.get('train/reward', float('nan')):.3f} | "
                f"{self._second_figure(metrics)} | "
                f"{per_step:.3f} s/step | eta {eta:4.0f}s")
        if self.interactive:
            end = "\n" if self.done >= self.total else ""
            print("\r" + line, end=end, flush=True)
        elif self.done % self.every == 0 or self.done >= self.total:
            self.log(line)

    @staticmethod
    def _second_figure(metrics: dict) -> str:
        """Team success, and the stage the step belongs to when the loop says."""
        stage = f" | {metrics['train/stage_name']}" if "train/stage_name" in metrics else ""
        return f"team success {metrics.get('train/team_success', float('nan')):.3f}{stage}"
