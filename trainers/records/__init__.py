"""What a run leaves on disk, written so that a crash or a full disk loses nothing.

    rundir.py      a run directory's life: fresh, resumed or restarted; its state file
    checkpoint.py  atomic checkpoints and exact resume
    interrupted.py what an interrupted checkpoint write leaves, removed at the next start and write
    manifest.py    sha256 manifests of checkpoints
    tracking.py    the Tracker interface: JSONL, W&B (the only wandb import) and no-op backends
    report.py      PNG plots and report.md from metrics.jsonl
    progress.py    the console progress line

May import: common (atomic files and directories), judges (strict JSON), nothing else of trainers.
"""
