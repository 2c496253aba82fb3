# The training-dynamics sweep (config sections `dynamics`, `train.checkpoints`,
# `revisions`; posmech.verdicts.dynamics): the followed quantities of every checkpoint, one table and
# one figure for the report.


# Cheap (reads CSV tables, plots): runs locally also with profiles/slurm.
localrules:
    dynamics,
    formation_order,


# One job per checkpoint (a sweep point): the followed rules, and the rules they read, as
# their own jobs would run them, in one process, without figures (posmech.pipeline.sweep). One rule
# per swept model: which followed rules apply, and so the outputs, can differ between models.
# A random-init twin (config `twins.figures: false`) and a model configured with `figures:
# false` are points of their own (OWN_POINTS): every analysis the model runs, in one job,
# without figures (only its verdicts and tables are shown).
SWEEP = sweep_points_of_run()

for _model, _first in swept_models(SWEEP.parts, POINT_OF).items():

    rule:
        name:
            sweep_rule_name(_model)
        input:
            unpack(SWEEP.inputs),
        output:
            **point_outputs(SWEEP.parts[_first]),
        log:
            "logs/sweep/{model}.log",
        benchmark:
            "benchmarks/sweep/{model}.tsv"
        wildcard_constraints:
            model=regex([c for c, m in POINT_OF.items() if m == _model]),
        conda:
            "../envs/posmech.yaml"
        threads: model_threads
        resources:
            gpu=heavy_resources,
            mem_mb=SWEEP.resource("mem_mb", max),
            runtime=SWEEP.resource("runtime", sum),
        params:
            parts=SWEEP.params,
        script:
            "../../scripts/sweep_point.py"


rule dynamics:
    """Each followed finding and head quantity (section `dynamics`) at every point of every
    sweep: the model's checkpoints, then the model itself."""
    input:
        findings=static("resources/findings.yaml"),
        schema=static("workflow/schemas/findings.schema.yaml"),
        scorecards=sweep_scorecards,
        heads=lambda wc: expand(
            rules.head_table.output.table,
            model=[m for m in head_table_models() if m in sweep_models()],
        ),
    output:
        table="results/report/dynamics.csv",
        figure="results/report/dynamics.png",
    log:
        "logs/report/dynamics.log",
    benchmark:
        "benchmarks/report/dynamics.tsv"
    conda:
        "../envs/posmech.yaml"
    params:
        points=SWEEP_POINTS,
        claims=config["dynamics"]["claims"],
        heads=config["dynamics"]["heads"],
        formation=config["dynamics"]["formation"],
        thresholds=config["findings"],
        not_applicable=lambda wc: {m: NOT_APPLICABLE[m] for m in sweep_models()},
    script:
        "../../scripts/dynamics.py"


collect(rules.dynamics, when=bool(SWEEP_POINTS))


rule formation_order:
    """S5 on a swept model, from its whole sweep (the dynamics table): the step at which the
    sink forms over the step at which the induction head forms (dynamics.formation's roles
    attention_sink and induction_head). Declared in workflow/analyses/formation_order.yaml;
    a model without checkpoints does not run it (posmech.pipeline.study)."""
    input:
        dynamics=rules.dynamics.output.table,
    output:
        **declared_outputs("formation_order"),
    log:
        "logs/formation_order/{model}.log",
    benchmark:
        "benchmarks/formation_order/{model}.tsv"
    wildcard_constraints:
        model=regex(JOB_MODELS),  # only swept models are collected (never a sweep point)
    conda:
        "../envs/posmech.yaml"
    params:
        formation=config["dynamics"]["formation"],
    script:
        "../../scripts/formation_order.py"


collect(rules.formation_order, model=swept_final_models())
