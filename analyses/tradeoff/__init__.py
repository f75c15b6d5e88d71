"""python -m analyses.tradeoff grid|swap|shrink|compare : attention against MLP as the fact store.

grid    Train the H x m grid (paper Figure 4 right: S=R=32, D=8, N=64, T=32, d=32, d_h=8)
        and record, per cell, held-out accuracy AND where locate_facts finds the facts
        (shares labelled attention / mlp / both / distributed / not_stored). Heat maps of
        accuracy and of the attention, MLP and distributed shares, with the 99% frontier
        (the smallest m reaching 99% at each H).
swap    One task and model trained three ways: both free, MLP removed (attention only),
        OV path frozen at its random init; where do the facts go?
shrink  On one trained model (--ckpt, or trained here): prune MLP neurons (smallest
        ||W_in[:, i]|| ||W_out[i, :]|| first) and heads (smallest ||W_V W_O|| first) step by
        step, and re-measure which facts survive and which store they were in before.
compare Two recorded grids side by side (GRID GRID --out DIR): each one's 99% frontier and
        attention floor, its mean storage shares, the settings the two differ in, and heat
        maps of the second grid minus the first.

Every cell is one JSON file in --out/cells/ (a re-run with the same settings skips it);
CSV next to the figures, summary.json. Cells run in this process (--executor local), in
--jobs worker processes of this machine (--executor processes) or as Ray tasks (--executor
ray: one worker per core, or a cluster with --ray-address). Task,
model and training flags as models.train, starting from the paper-tradeoff preset.
"""
from analyses.tradeoff.cli import main, parser
from analyses.tradeoff.grid import Grid
from analyses.tradeoff.shrink import Shrink, pruning_steps

__all__ = ["Grid", "Shrink", "main", "parser", "pruning_steps"]
