"""`python -m models.train`: the toolkit's main command, the factual-recall trainer's command
line (models/recall/train.py; `python -m models.recall.train` is the same command)."""
from models import cli
from models.recall.train import main

if __name__ == "__main__":
    cli.run_cli(main)
