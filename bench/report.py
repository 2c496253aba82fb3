"""Benchmark: the `report` rule's work (scorecard + HTML + copies) on study-sized inputs.

    OMP_NUM_THREADS=1 .venv/bin/python bench/report.py [--models 3] [--figures 25] [--tables 10]

Fabricates, per model, the given number of 150-dpi PNG figures (6x4 in) and tidy tables
(2,000 rows), one scorecard per analysis rule with one row for each published quantity, a
training summary and benchmark files, then times :func:`posmech.report.html.build` (what the
rule's script runs).  The report's cost depends on the number and size of the figures and
tables, not on the model, so this stands in for the demo and the full study.  Target:
under 30 s.  Numbers go to docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from posmech.plots import save
from posmech.report import html as rp
from posmech.verdicts.scorecard import load_published
from posmech.store.tables import scorecard_rows, write_table

REPO = Path(__file__).resolve().parents[1]


def fabricate(models: int, figures: int, tables: int) -> dict:
    rng = np.random.default_rng(0)
    entries = load_published(REPO / "resources" / "published.yaml")
    names = [f"m{i}" for i in range(models)]
    figs, tabs, cards, flags = [], [], [], {}
    caption = Path("caption.rst")
    caption.write_text("**P6** figure of ``{{ snakemake.wildcards.model }}``.\n")
    for m in names:
        for i in range(figures):
            p = f"results/{m}/stage/fig{i}.png"
            Path(p).parent.mkdir(parents=True, exist_ok=True)
            fig, ax = plt.subplots(figsize=(6, 4))
            ax.imshow(rng.random((64, 64)))
            ax.set_title(f"P6 figure {i}")
            save(fig, p)
            figs.append(p)
            flags[p] = {"rule": "stage", "wildcards": {"model": m}, "caption": str(caption), "category": "P"}
        for i in range(tables):
            p = f"results/{m}/stage/table{i}.csv"
            write_table(pd.DataFrame({"claim": "K4", "model": m, "x": rng.random(2000)}), p)
            tabs.append(p)
            flags[p] = {"rule": "stage", "wildcards": {"model": m}, "caption": str(caption), "category": "K"}
        rules: dict[str, list[dict]] = {}
        for j, e in enumerate(entries):
            rules.setdefault(f"rule{j % 12}", []).append(
                {"claim": e.claim, "quantity": e.quantity, "model": m, "value": 0.5, "artifact": figs[-1]})
        for r, rows in rules.items():
            p = f"results/{m}/scorecard/{r}.csv"
            Path(p).parent.mkdir(parents=True, exist_ok=True)
            write_table(scorecard_rows(rows), p)
            cards.append(p)
        Path(f"benchmarks/stage/{m}.tsv").parent.mkdir(parents=True, exist_ok=True)
        Path(f"benchmarks/stage/{m}.tsv").write_text("s\th:m:s\tmax_rss\n1.0\t0:00:01\t100\n")
    summary = Path("results/m0/training/summary.json")
    summary.parent.mkdir(parents=True, exist_ok=True)
    summary.write_text(json.dumps({"model": "m0", "heldout_loss": 1.3, "train_seconds": 1.0,
                                   "previous_token_scores": [[0.1] * 4] * 2,
                                   "best_previous_token_head": "L1H0", "best_previous_token_score": 0.9}))
    return dict(
        html="results/report/index.html", figures_dir="results/report/figures",
        scorecard_csv="results/report/scorecard.csv", published=str(REPO / "resources" / "published.yaml"),
        scorecards=cards, figures=figs, tables=tabs, summaries=[str(summary)], manifests=[], tokens=[],
        flags=flags, config={"models": {m: {} for m in names}}, benchmarks="benchmarks",
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", type=int, default=3)
    ap.add_argument("--figures", type=int, default=25)
    ap.add_argument("--tables", type=int, default=10)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        kwargs = fabricate(args.models, args.figures, args.tables)
        cpu0, t0 = time.process_time(), time.perf_counter()
        counts = rp.build(**kwargs)
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        size = sum(f.stat().st_size for f in Path("results/report").rglob("*") if f.is_file())
        print(f"{args.models} models x ({args.figures} figures + {args.tables} tables), "
              f"{len(kwargs['scorecards'])} scorecards -> {sum(counts.values())} scorecard rows")
        print(f"report.build: wall {wall:.2f} s, CPU {cpu:.2f} s, report folder {size / 1e6:.1f} MB "
              f"(load average {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
