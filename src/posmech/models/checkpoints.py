"""Checkpoints: a model's earlier states of training as models of the run (the dynamics sweep).

A model may name checkpoints:

* a model trained by the pipeline, ``train.checkpoints: [0, 50, 100, …]``: the training job
  saves its weights after each of those steps (0: the initialisation) next to the final
  model, and rule ``checkpoint_model`` makes each one a model of its own;
* a Hub model, ``revisions: [step1000, step2000, …]``: each revision (a branch, tag or
  commit, as Pythia names its checkpoints) is fetched by rule ``fetch_model`` like any Hub
  model, its commit resolved and recorded in its manifest.

Each checkpoint is the run's model ``<model>@<revision>`` (``demo@step50``,
``pythia-70m@step1000``; :func:`checkpoint_name`): its own manifest
(``resources/models/<model>@<revision>/manifest.json``), outputs (``results/<model>@<revision>/…``)
and jobs, so each checkpoint's analyses are independent jobs (Slurm submits them in parallel).
A checkpoint runs only the analysis families the ``dynamics`` section follows
(:mod:`posmech.verdicts.dynamics`); its findings are not in the findings grid, but in
``results/report/dynamics.csv``. The model itself is the sweep's last point (revision
``final``). Model names cannot contain ``@`` (the schema's name pattern), so the name is
unambiguous.
"""

from __future__ import annotations

import re
from typing import Any

from posmech.core.errors import PosmechError

#: between a model's name and its revision in a checkpoint's name
SEP = "@"
#: the revision of a trained model's checkpoint after ``N`` steps
TRAINED_REVISION = "step{}"
#: the revision label of the model itself, the sweep's last point
FINAL = "final"


def checkpoint_name(model: str, revision: str) -> str:
    """The run's name of ``model``'s checkpoint ``revision``."""
    return f"{model}{SEP}{revision}"


def step_of(revision: str) -> int | None:
    """The training step a revision names (``step1000`` → 1000; Pythia's and the demo's
    convention), ``None`` for any other name (a tag, a commit)."""
    m = re.fullmatch(r"step(\d+)", revision)
    return int(m.group(1)) if m else None


def revisions_of(name: str, entry: dict[str, Any]) -> list[str]:
    """The checkpoint revisions model ``name`` asks for (trained: ``stepN`` in step order;
    Hub: as listed). A configuration no checkpoint can come from is a :class:`PosmechError`
    naming the key."""
    if "train" in entry:
        t = entry["train"]
        steps = sorted(int(s) for s in t.get("checkpoints") or [])
        late = [s for s in steps if s >= int(t["steps"])]
        if late:
            raise PosmechError(
                f"config key `models.{name}.train.checkpoints`: {late} are not before the last step "
                f"(train.steps = {t['steps']}); the model itself is the sweep's last point: list earlier steps")
        return [TRAINED_REVISION.format(s) for s in steps]
    revisions = list(entry.get("revisions") or [])
    if revisions and "twin_of" not in entry:
        from posmech.core.config import is_local

        if is_local(entry["source"]):
            raise PosmechError(
                f"config key `models.{name}.revisions`: a local directory has no revisions; give each "
                "checkpoint directory a model entry of its own, or point `source` at a Hub id")
        if entry.get("revision") in revisions:
            raise PosmechError(
                f"config key `models.{name}.revisions`: {entry['revision']!r} is the model's own "
                f"`revision` (the sweep's last point); list the other revisions")
    return revisions


def add_checkpoints(config: dict[str, Any]) -> list[str]:
    """Add a model entry ``<m>@<revision>`` to ``config["models"]`` (in place) for every
    checkpoint a model names, with ``checkpoint_of`` (its model) and ``step``; a Hub
    checkpoint keeps its model's ``source`` with its own ``revision``, a trained one its
    model's ``train`` (read for the architecture; the weights come from the training job).
    Each is added to every config section's ``models`` list that names its model (an empty
    list already means every model); which analyses run on it is the ``dynamics`` section's
    choice (:func:`posmech.verdicts.dynamics.sweep_families`). Returns the checkpoints' names in
    model and step order."""
    models = config["models"]
    added: dict[str, str] = {}
    for m, entry in list(models.items()):
        if "twin_of" in entry or "checkpoint_of" in entry:
            continue
        for rev in revisions_of(m, entry):
            name = checkpoint_name(m, rev)
            base = {k: v for k, v in entry.items() if k != "revisions"}
            if "train" not in entry:
                base["revision"] = rev
            models[name] = {**base, "checkpoint_of": m, "step": step_of(rev), "checkpoint_revision": rev}
            added[name] = m
    for section in config.values():
        if isinstance(section, dict) and isinstance(section.get("models"), list):
            listed = section["models"]
            section["models"] = listed + [c for c, m in added.items() if m in listed]
    return list(added)


def checkpoints_of(config: dict[str, Any]) -> dict[str, str]:
    """``{checkpoint: its model}`` of the run's configured models."""
    return {n: e["checkpoint_of"] for n, e in config["models"].items() if "checkpoint_of" in e}


def sweep_points(config: dict[str, Any]) -> list[dict[str, Any]]:
    """Every point of the run's sweeps, in model and step order: ``model`` (the followed
    model), ``revision``, ``step`` and ``checkpoint`` (the run's model name of that point);
    each swept model's own last point is revision :data:`FINAL` (step: a trained model's
    ``train.steps``; a Hub model's from its revision name, else ``None``)."""
    models = config["models"]
    out: list[dict[str, Any]] = []
    for m, entry in models.items():
        points = [c for c, e in models.items() if e.get("checkpoint_of") == m]
        if not points:
            continue
        for c in points:
            e = models[c]
            out.append({"model": m, "revision": e["checkpoint_revision"], "step": e["step"], "checkpoint": c})
        final_step = int(entry["train"]["steps"]) if "train" in entry else step_of(str(entry.get("revision") or ""))
        out.append({"model": m, "revision": FINAL, "step": final_step, "checkpoint": m})
    return out
