"""python -m analyses.tradeoff"""
from analyses.sweeps import cli
from analyses.tradeoff.cli import main

if __name__ == "__main__":
    cli.run_cli(main)
