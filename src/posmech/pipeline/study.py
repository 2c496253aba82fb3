"""The study a config describes, prepared once when the workflow is parsed, before any job.

:func:`prepare` does, in order, what ``workflow/rules/common.smk`` needs before it declares
a rule: validate the config against the schema (defaults filled in) and run every preflight
check (:func:`posmech.pipeline.preflight.preflight`: all problems in one round); explain a lock of
this working directory (:func:`posmech.pipeline.runs.lock_report`); add the random-init twins
(:mod:`posmech.models.twin`) and the checkpoints (:mod:`posmech.models.checkpoints`) as
models of the run; build each family's settings (:mod:`posmech.settings`); read each
model's architecture (:func:`posmech.pipeline.preflight.architectures`) and decide which analysis
runs on which model (:class:`posmech.pipeline.applicability.Schedule`). A problem is a
:class:`~posmech.core.errors.PosmechError` naming the key; the workflow turns it into a
``WorkflowError``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from posmech.pipeline.applicability import Schedule
from posmech.models.architecture import Architecture
from posmech.settings import StudySettings


@dataclass
class Study:
    """A prepared config: its models (twins and checkpoints added), settings and schedule."""

    #: every model of the run, twins and checkpoints included, in config order
    models: list[str]
    #: the random-init twins, and ``{twin: its model}``
    twins: list[str]
    twin_of: dict[str, str]
    #: the checkpoints, ``{checkpoint: its model}``, and the dynamics sweep's points
    checkpoints: list[str]
    checkpoint_of: dict[str, str]
    sweep_points: list[dict[str, Any]]
    settings: StudySettings
    architectures: dict[str, Architecture | None]
    #: ``{model: {rule: why it cannot run}}``
    not_applicable: dict[str, dict[str, str]]
    schedule: Schedule
    #: lines for the terminal (a lock explained, models some rules skip)
    notes: list[str] = field(default_factory=list)
    #: the models whose analyses run as one job each, without figures (their tables, HDF5
    #: files and verdicts only; rule ``sweep_<model>``, :mod:`posmech.pipeline.sweep`): those
    #: configured with ``figures: false``, and the twins unless ``twins.figures``
    figureless: list[str] = field(default_factory=list)

    @property
    def final_models(self) -> list[str]:
        """The models of the findings grid and the report: every model but the checkpoints."""
        return [m for m in self.models if m not in self.checkpoint_of]


def refuse_changed_tables(results: str | os.PathLike[str]) -> None:
    """Before any job: no table of the run (``results/``) may differ from the bytes its
    sidecar's sha256 recorded when it was written (an edit, a truncation): a run would compute
    verdicts from it. Raises :class:`PosmechError` naming each one and how to regenerate it."""
    from posmech.core.errors import PosmechError
    from posmech.store.tables import changed_tables

    changed = changed_tables(results) if os.path.isdir(results) else []
    if changed:
        shown = "\n  ".join(changed[:10]) + (f"\n  … and {len(changed) - 10} more" if len(changed) > 10 else "")
        raise PosmechError(
            f"{len(changed)} table(s) changed after they were written (their bytes differ from the sha256 in their "
            f".meta.json), and the run would read them:\n  {shown}\nDelete each (with its .meta.json) and rerun: "
            "Snakemake writes it again. To study an edited table, save a copy under another name "
            "(docs/artifacts.md, \"CSV tables\"). Checked before any job: nothing was run.")


def prepare(config: dict[str, Any], schema: dict[str, Any], repo: str | os.PathLike[str], findings_path: str,
            configfiles: list[str], main_process: bool, runs_jobs_here: bool, dry_run: bool,
            unlocking: bool = False) -> Study:
    """Prepare ``config`` (changed in place: defaults, twins, checkpoints) for the workflow.

    ``main_process``: the Snakemake process that plans the run (not a job's own); it checks
    the weights, the lock and the tables already written (:func:`refuse_changed_tables`). ``runs_jobs_here``: jobs run on this machine (not a cluster
    submission); ``dry_run``: nothing is fetched, so a Hub model's reachability is not
    checked; ``unlocking``: the run was started with ``--unlock``."""
    from posmech.pipeline.applicability import not_applicable
    from posmech.core.config import validate_config
    from posmech.verdicts.dynamics import FORMATION_ANALYSIS, NO_SWEEP, sweep_rules
    from posmech.core.errors import PosmechError
    from posmech.models.checkpoints import add_checkpoints, checkpoints_of, sweep_points
    from posmech.models.twin import add_twins, twins_of
    from posmech.pipeline.preflight import architectures, preflight
    from posmech.settings import build

    # semantic problems (missing paths, unknown names): preflight reports them with the rest
    validate_config(config, schema, semantic=False)
    # duplicate YAML keys, every named file, the model's shape, the device (one round)
    preflight(config, schema, repo=repo, configfiles=configfiles, jobs_run_here=main_process and runs_jobs_here,
              check_weights=main_process, fetches_here=main_process and not dry_run)
    notes = []
    if main_process:  # a live run here: `--unlock` is refused, a left-over lock explained
        from posmech.pipeline.runs import lock_report

        message, refuse = lock_report(unlocking=unlocking)
        if refuse:
            raise PosmechError(str(message))
        if message:
            notes.append(message)
        if not dry_run:  # a failed analysis's records: deleted, so that its jobs run again
            from posmech.core.failures import remove_failures

            removed = remove_failures("results")
            if removed:
                notes.append(f"posmech: {len(removed)} failure record(s) of analyses that failed in an earlier run "
                             "deleted (posmech.core.failures); their jobs run again")
        refuse_changed_tables("results")
    twins = add_twins(config)
    checkpoints = add_checkpoints(config)
    twin_of, checkpoint_of = twins_of(config), checkpoints_of(config)
    figureless = [m for m, e in config["models"].items()
                  if (e.get("figures") is False and m not in twin_of)
                  or (m in twin_of and not (config.get("twins") or {}).get("figures", False))]
    swept_models = set(checkpoint_of.values())
    figureless_swept = [m for m in figureless if m in swept_models]
    if figureless_swept:
        raise PosmechError(f"config key `models.{figureless_swept[0]}.figures`: false runs the model's analyses as one job, "
                           "and so does each of its checkpoints in the dynamics sweep (section `dynamics`), with "
                           "other analyses: the two cannot share a rule. Remove `figures: false`, or the model's "
                           "checkpoints (`revisions` / `train.checkpoints`)")
    archs = architectures(config, twin_of, checkpoint_of)
    skipped = {m: not_applicable(archs[m]) for m in config["models"]}
    schedule = Schedule(skipped, checkpoint_of, sweep_rules(config["dynamics"], findings_path, bool(checkpoints)))
    if main_process:
        notes += schedule.notes(archs)
    # S5 (FORMATION_ANALYSIS) reads a model's whole dynamics sweep: a model without one cannot
    # run it (added after the notes, which list what a model's architecture rules out)
    points = sweep_points(config)
    swept = {p["model"] for p in points}
    for m in config["models"]:
        if m not in swept:
            skipped[m][FORMATION_ANALYSIS] = NO_SWEEP
    return Study(list(config["models"]), twins, twin_of, checkpoints, checkpoint_of, points,
                 build(config), archs, skipped, schedule, notes, figureless)
