# The final report: results/report/index.html (+ figures/ next to it, works offline and
# from a copied folder) with the published-vs-reproduced scorecard at the top.
# Inputs are named through the registries of common.smk (SCORECARDS, REPORT_FIGURES,
# REPORT_TABLES) and every other stage's targets, so the report is the last job.


# Cheap (read HDF5/CSV, plot): run locally also with profiles/slurm (docs/cluster.md).
localrules:
    report,


def report_registered(registry):
    return list(dict.fromkeys(p for paths in registry for p in paths()))


def report_figures():
    """Registered figures, then each trained model's training curve."""
    curves = [
        f"results/{m}/training/curve.png" for m in model_names_by_kind(config, "train")
    ]
    return list(dict.fromkeys(report_registered(REPORT_FIGURES) + curves))


def report_upstream_targets():
    """Every other stage's final targets: the report runs after all of them."""
    return [
        t for targets in TARGETS if targets is not report_targets for t in targets()
    ]


def report_flags(wildcards):
    """Per figure/table: the producing rule, its wildcards and its report() caption and
    category (so the HTML report reuses the captions of Snakemake's native report)."""
    out = {}
    for path in report_figures() + report_registered(REPORT_TABLES):
        for r in workflow.rules:
            for o in r.output:
                flag = o.flags.get("report")
                match = o.match(path) if flag is not None else None
                if match:
                    caption = flag.caption
                    out[path] = {
                        "rule": r.name,
                        "wildcards": match.groupdict(),
                        "caption": (
                            caption.get_path_or_uri(secret_free=True)
                            if caption
                            else None
                        ),
                        "category": flag.category,
                    }
                    break
            if path in out:
                break
    return out


rule report:
    """Assemble the HTML report and the scorecard (published vs reproduced)."""
    input:
        published=static("resources/published.yaml"),
        scorecards=lambda wc: report_registered(SCORECARDS),
        figures=lambda wc: report_figures(),
        tables=lambda wc: report_registered(REPORT_TABLES),
        summaries=lambda wc: [
            f"results/{m}/training/summary.json"
            for m in model_names_by_kind(config, "train")
        ],
        manifests=[manifest(m) for m in MODELS],
        tokens=lambda wc: tokens_targets(),
        upstream=lambda wc: report_upstream_targets(),
    output:
        html="results/report/index.html",
        figures=directory("results/report/figures"),
        scorecard=report(
            "results/report/scorecard.csv",
            caption="../report/scorecard.rst",
            category="Scorecard",
        ),
    log:
        "logs/report/report.log",
    benchmark:
        "benchmarks/report/report.tsv"
    params:
        flags=report_flags,
        benchmarks="benchmarks",
    script:
        "../../scripts/report.py"


def report_targets():
    return ["results/report/index.html", "results/report/scorecard.csv"]


TARGETS.append(report_targets)
