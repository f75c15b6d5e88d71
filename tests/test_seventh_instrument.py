"""A new instrument in under 20 lines: the example of docs/locate_facts.md ("Adding an
instrument"), run as written, shares the prompts of the others and joins locate's facts."""
import re
from pathlib import Path

import torch

from analyses.locate_facts import locate
from models import build_bridge
from probe import columns
from probe.hooks import hooked_last_logits
from probe.prompts import FactPrompts

DOC = Path(__file__).parents[1] / "docs" / "locate_facts.md"


def documented_instrument() -> tuple[str, dict]:
    """The example's source and the names it defines."""
    section = DOC.read_text().split("## Adding an instrument")[1].split("\n## ")[0]
    source = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    names: dict = {}
    exec(compile(source, str(DOC), "exec"), names)
    return source, names


def test_the_example_instrument_is_short_and_joins_locate_s_facts(tiny_result):
    source, names = documented_instrument()
    assert len([line for line in source.splitlines() if line.strip()]) < 20
    answer_logit = names["answer_logit"]
    model, task = build_bridge(tiny_result.section, tiny_result.weights), tiny_result.task
    prompts = FactPrompts.build(model, task, contexts=4)
    measured = answer_logit(model, task, prompts=prompts)
    assert measured.index.names == list(columns.FACT) and len(measured) == task.n_facts
    assert measured.equals(answer_logit(model, task, contexts=4))  # its own prompts are the same prompts

    located = locate(model, task, contexts=4, patch_contexts=1, progress=False)
    joined = located.facts.join(measured)  # both indexed by the fact
    assert len(joined) == task.n_facts and joined["answer_logit"].notna().all()

    full = hooked_last_logits(model, prompts.batch.tokens)  # [n, O] the whole prompts, run again
    expected = prompts.per_fact(full.gather(-1, prompts.batch.answers[:, None])[:, 0]).mean(1)  # [F]
    assert torch.allclose(torch.tensor(joined["answer_logit"].to_numpy()), expected, atol=1e-4)
