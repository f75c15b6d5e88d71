"""The machinery every study runs on (it imports no study):

  cells.py      the sweep engine: cells, jobs, `run_jobs`, finished cells recorded in OUT/cells/
  search.py     the search for the largest size that passes, as jobs of a sweep
  executors.py  where cells run: local, worker processes, Ray
  cli.py        the flags every analysis shares (checkpoint, --out, --device, the sweep flags)
  output.py     tables, summaries and figures written atomically
"""
