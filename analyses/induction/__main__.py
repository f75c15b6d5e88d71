from analyses.induction.cli import main
from analyses.sweeps import cli

if __name__ == "__main__":
    cli.run_cli(main)
