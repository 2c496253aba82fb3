"""Rule report: scorecard (published vs reproduced) and the offline HTML report."""

from posmech.report.html import build
from posmech.pipeline.runner import run


def main(smk, log):
    counts = build(
        html=smk.output.html,
        figures_dir=smk.output.figures,
        scorecard_csv=smk.output.scorecard,
        published=smk.input.published,
        scorecards=list(smk.input.scorecards),
        figures=list(smk.input.figures),
        tables=list(smk.input.tables),
        summaries=list(smk.input.summaries),
        manifests=list(smk.input.manifests),
        tokens=list(smk.input.tokens),
        flags=dict(smk.params.flags),
        config=dict(smk.config),
        benchmarks=smk.params.benchmarks,
        claims=smk.input.claims,
        findings=smk.input.findings,
        heads=list(smk.input.heads),
        # the training-dynamics section (rule dynamics), in a run with checkpoints only
        dynamics=next((p for p in smk.input.dynamics if p.endswith(".csv")), None),
        dynamics_figure=next((p for p in smk.input.dynamics if p.endswith(".png")), None),
    )
    log.info("scorecard: %s", ", ".join(f"{k} {v}" for k, v in counts.items()))
    log.info("report written to %s", smk.output.html)


if __name__ == "__main__":  # a job of its own; a family job imports main (posmech.pipeline.runner)
    run(snakemake, main)  # noqa: F821
