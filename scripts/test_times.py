"""Sum what each test cost from the file that tests/conftest.py writes with FACTUAL_RECALL_TEST_TIMES=FILE.

    .venv/bin/python scripts/test_times.py FILE [--top 40]

Prints the totals (wall seconds, CPU seconds of pytest and of its subprocesses) and the tests that cost
the most CPU, one line each: CPU s, wall s, test (setup, call and teardown together).
"""
import argparse
from collections import defaultdict
from pathlib import Path


def per_test(path: Path) -> dict[str, list[float]]:
    """nodeid -> [wall s, CPU s with the children's], phases summed."""
    totals = defaultdict(lambda: [0.0, 0.0])
    for line in path.read_text().splitlines():
        nodeid, _phase, wall, own, children = line.split("\t")
        totals[nodeid][0] += float(wall)
        totals[nodeid][1] += float(own) + float(children)
    return dict(totals)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", type=Path)
    parser.add_argument("--top", type=int, default=40, help="how many of the costliest tests to list (default 40)")
    args = parser.parse_args(argv)
    if not args.file.is_file():
        parser.error(f"no such file: {args.file}")
    tests = per_test(args.file)
    wall, cpu = (sum(t[i] for t in tests.values()) for i in (0, 1))
    print(f"{len(tests)} tests: {wall:.0f} s wall, {cpu:.0f} s CPU (pytest and its subprocesses)")
    for nodeid, (w, c) in sorted(tests.items(), key=lambda kv: -kv[1][1])[: args.top]:
        print(f"{c:8.1f} s CPU {w:8.1f} s wall  {nodeid}")


if __name__ == "__main__":
    main()
