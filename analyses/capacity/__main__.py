"""`python -m analyses.capacity memory|transformer ...`"""
from analyses import cli
from analyses.capacity.cli import main

if __name__ == "__main__":
    cli.run_cli(main)
