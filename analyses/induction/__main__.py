from analyses import cli
from analyses.induction.cli import main

if __name__ == "__main__":
    cli.run_cli(main)
