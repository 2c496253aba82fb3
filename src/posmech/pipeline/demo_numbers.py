"""The demo run's numbers in the docs, written from a run's outputs (``make demo-numbers``).

Every number of README.md and docs/*.md that ``make demo`` produces (the demo models' head
scores, held-out losses, the findings grid's counts, the twins' values, what the P rules find
on ``demo``) sits in a marked block ``<!-- generated: numbers.NAME -->`` …
``<!-- end generated -->`` (:data:`BLOCKS`; the block writer of :mod:`posmech.core.generated`),
written from :data:`NUMBERS` (``docs/demo-numbers.json``), never by hand:

* ``python -m posmech.pipeline.demo_numbers --from-run results`` (``make demo-numbers``, after
  ``make demo``) gathers the run's numbers from ``results/`` (:func:`collect`: the training
  summaries, the head-roles tables, the scorecards and the findings table) into
  ``docs/demo-numbers.json``, then rewrites the blocks;
* ``--write`` rewrites the blocks from ``docs/demo-numbers.json`` (``make docs`` runs it);
  ``--check`` exits 1 naming the stale files.

``docs/demo-numbers.json`` records the ``train`` section of each model it holds
(:func:`train_digest`): when ``config/demo.yaml`` trains a model differently, its numbers are
stale until ``make demo`` and ``make demo-numbers`` have run (``tests/test_demo_numbers.py``).

Outside the blocks, :func:`typed_run_numbers` finds what looks like a run's number typed by
hand (a head, claim or loss followed by a decimal), except in a range (``0.86–0.92``), in the
posts' published values (:data:`PUBLISHED_SECTIONS`), in the dated measurements of
:data:`MEASUREMENT_DOCS`, and in a paragraph marked ``<!-- history: … -->`` (earlier recipes and
seeds: not what the current run gives).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

from posmech.core.errors import PosmechError
from posmech.core.generated import BEGIN, END, changed, fill_blocks
from posmech.core.generated import main as generator_main
from posmech.core.io import REPO

#: the stored numbers of the last demo run the docs quote
NUMBERS = REPO / "docs" / "demo-numbers.json"
#: the files whose ``numbers.…`` blocks this module writes
DOCS: tuple[Path, ...] = (REPO / "README.md", *sorted((REPO / "docs").glob("*.md")))
DEMO_CONFIG = REPO / "config" / "demo.yaml"
PREFIX = "numbers."
COMMAND = "make demo-numbers  (after make demo; python -m posmech.pipeline.demo_numbers --from-run results)"
WRITE_COMMAND = "make docs  (python -m posmech.pipeline.demo_numbers --write)"

#: the one place the docs say why a trained model's numbers vary (each table block ends with it)
VARIES = ("Trained models differ across CPUs in the last digits (the same seeded steps sum their floats in "
          "another order on another CPU), so a run on your machine can differ from these by about 0.01–0.02: "
          "`make demo` on different machines gave `demo`'s L1H0 0.912 to 0.926.")

#: the scorecard quantities the blocks quote (``results/{model}/scorecard/<analysis>.csv``)
SCORECARDS: dict[str, tuple[str, ...]] = {
    "prev_knockout": ("prev_token_mass_intact", "prev_token_mass_knockout", "prev_token_mass_ratio_knocked"),
    "repeated_tokens": ("prev_token_mass_repeat", "prev_token_mass_other", "repeat_token_blip"),
    "extended_averaging": ("early_minus_sharp_damage", "damage_*"),
    "induction_intervention": ("p_ram_baseline", "p_ewe_after", "p_ram_after", "p_ram_redirect_only",
                               "p_ewe_redirect_only"),
    "random_token_patterns": ("previous_candidate_score", "induction_candidate_score",
                              "look_back_two_candidate_score"),
    "diagonal_taxonomy": ("n_prev_token_heads", "n_prev_token_heads_post", "prev_token_head_fraction",
                          "prev_token_head_fraction_post"),
}
#: the summary.json entries kept (numbers and head names; the per-head score tables too)
SUMMARY_KEYS = (
    "architecture", "best_previous_token_head", "best_previous_token_score", "best_look_back_two_head",
    "best_look_back_two_score", "best_induction_head", "best_induction_score", "induction_reads_head",
    "induction_score_with_read_head_ablated", "previous_token_heads_below",
    "induction_score_with_previous_token_heads_ablated", "p_correct_repeated", "p_correct_repeated_ablated",
    "p_correct_first_copy", "heldout_loss", "train_cpu_seconds", "previous_token_scores",
)
HEAD_COLUMNS = ("prev_token_mass", "prev_token_excess", "previous_token", "diagonal_ratio", "p7_chosen")
ARCHITECTURES = {"gpt2": "GPT-2", "attn_only": "attention-only", "llama": "Llama layout (`LlamaForCausalLM`)"}
#: what the layout adds to an architecture's words
LAYOUT_WORDS = {"gpt2": "learned positions, LayerNorm, MLPs", "attn_only": "learned positions, LayerNorm, no MLP",
                "llama": "rotary positions, RMSNorm, SwiGLU MLPs"}

#: docs whose numbers are dated measurements of time and memory, not the run's results
MEASUREMENT_DOCS = ("performance.md", "performance-log.md", "cluster.md")
#: headings (regex) of the sections that hold the posts' published values, not the run's
PUBLISHED_SECTIONS = re.compile(r"^## (Source posts|[PLKCS] — |The self-check)")
HISTORY = re.compile(r"<!-- history: [^>]+-->")
#: a run's number typed by hand: a head, a claim, a loss or a probability, then a decimal
RUN_NUMBER = re.compile(
    r"(?P<what>\bL\d+H\d+\b|\b[PLKCS]\d{1,2}\b|held-out (?:text )?loss|P\((?:correct|[A-Za-z]+)\))"
    r"(?P<gap>[^.;|\n]{0,30}?)(?<![\d.–-])(?P<num>\d+\.\d{2,})(?![\d–])")


def _round(x: Any) -> Any:
    if hasattr(x, "item") and not isinstance(x, (list, dict)):  # a numpy scalar
        x = x.item()
    if isinstance(x, float):
        return float(f"{x:.6g}") if math.isfinite(x) else None
    if isinstance(x, list):
        return [_round(v) for v in x]
    if isinstance(x, dict):
        return {k: _round(v) for k, v in x.items()}
    return x


def train_digest(train: Mapping[str, Any]) -> str:
    """The sha256 of a model's ``train`` section (keys sorted): its numbers belong to it."""
    return hashlib.sha256(json.dumps(dict(train), sort_keys=True, default=str).encode()).hexdigest()[:16]


def trained_models(config: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """``{model: train section}`` of the models a config trains, in its order."""
    return {m: dict(e["train"]) for m, e in (config.get("models") or {}).items() if isinstance(e, dict) and e.get("train")}


def _scorecard(path: Path, wanted: tuple[str, ...]) -> dict[str, float]:
    from posmech.store.tables import read_table

    out: dict[str, float] = {}
    table = read_table(path)
    for q, v in zip(table["quantity"], table["value"]):
        q = str(q)
        if q in wanted or any(w.endswith("*") and q.startswith(w[:-1]) for w in wanted):
            try:
                out[q] = float(v)
            except (TypeError, ValueError):
                continue
    return out


def collect(results: Path, config: Path = DEMO_CONFIG) -> dict[str, Any]:
    """The numbers the blocks quote, from the outputs of a run of ``config`` under ``results``
    (``results/{model}/training/summary.json``, ``heads.csv``, ``scorecard/*.csv``,
    ``results/report/findings.csv``). Raises :class:`PosmechError` naming a missing output."""
    from posmech.store.tables import read_table

    cfg = yaml.safe_load(Path(config).read_text(encoding="utf-8")) or {}
    trained = trained_models(cfg)
    if not trained:
        raise PosmechError(f"{config}: no model with a `train` section: nothing of a demo run to collect")
    findings_path = results / "report" / "findings.csv"
    if not findings_path.exists():
        raise PosmechError(f"{findings_path} is missing: run `make demo` (or snakemake --configfile {config}) first")
    findings = read_table(findings_path)
    twins = {str(m): str(t) for m, t in zip(findings["model"], findings.get("twin_of", [None] * len(findings)))
             if isinstance(t, str) and t}  # {twin: the model it is the twin of}
    models: dict[str, Any] = {}
    stamp: float | None = None
    for m in [*trained, *(t for t, of in twins.items() if of in trained)]:
        entry: dict[str, Any] = {}
        summary_path = results / m / "training" / "summary.json"
        if m in trained:
            if not summary_path.exists():
                raise PosmechError(f"{summary_path} is missing: the run of {config} did not train {m!r} "
                                   "(run `make demo` first)")
            stamp = max(stamp or 0.0, summary_path.stat().st_mtime)
            s = json.loads(summary_path.read_text(encoding="utf-8"))
            entry["summary"] = {k: s[k] for k in SUMMARY_KEYS if k in s}
            t = s.get("train_config") or trained[m]
            entry["summary"]["layout"] = {k: t.get(k) for k in ("n_layer", "n_head", "d_model", "silent_attention_layers",
                                                                "silent_attention_steps")}
        heads_path = results / m / "heads.csv"
        if heads_path.exists():
            h = read_table(heads_path)
            entry["heads"] = {str(r["head_name"]): {c: r[c] for c in HEAD_COLUMNS if c in h and r[c] == r[c]}
                              for _, r in h.iterrows()}
        cards = {a: _scorecard(results / m / "scorecard" / f"{a}.csv", q) for a, q in SCORECARDS.items()
                 if (results / m / "scorecard" / f"{a}.csv").exists()}
        entry["scorecard"] = {a: c for a, c in cards.items() if c}
        rows = findings[findings["model"] == m]
        if m in trained:  # a twin's values are in its model's rows (twin_value, twin_verdict)
            entry["findings"] = {
                str(r["claim"]): {k: (None if isinstance(r.get(k), float) and r.get(k) != r.get(k) else r.get(k))
                                  for k in ("quantity", "value", "verdict", "twin_value", "twin_verdict", "origin")
                                  if k in rows}
                for _, r in rows.iterrows()}
        if m in twins:
            entry["twin_of"] = twins[m]
        models[m] = entry
    date = datetime.fromtimestamp(stamp or findings_path.stat().st_mtime, timezone.utc).strftime("%Y-%m-%d")
    return _round({
        "written_by": COMMAND,
        "run": {"date": date, "config": _rel(Path(config))},
        "train": {m: train_digest(t) for m, t in trained.items()},
        "models": models,
    })


def _rel(p: Path) -> str:
    p = p.resolve()
    return p.relative_to(REPO).as_posix() if p.is_relative_to(REPO) else str(p)


# --------------------------------------------------------------------------- the blocks
def f3(x: Any) -> str:
    """A score as the docs print it: 3 decimals (a probability below 0.001: 1 significant digit)."""
    if x is None:
        return "—"
    x = float(x)
    return f"{x:.0e}".replace("e-0", "e-") if 0 < abs(x) < 0.001 else f"{x:.3f}"


@dataclass(frozen=True)
class Run:
    """The stored numbers (:data:`NUMBERS`), read."""

    data: dict[str, Any]

    @property
    def date(self) -> str:
        return str(self.data["run"]["date"])

    def trained(self) -> list[str]:
        return [m for m, e in self.data["models"].items() if "summary" in e]

    def summary(self, m: str) -> dict[str, Any]:
        return self.data["models"][m]["summary"]

    def model(self, m: str) -> dict[str, Any]:
        return self.data["models"].get(m, {})

    def twin(self, m: str) -> str | None:
        return next((t for t, e in self.data["models"].items() if e.get("twin_of") == m), None)

    def provenance(self) -> str:
        return (f"Measured by `make demo` on {self.date} (the training summaries "
                "`results/{model}/training/summary.json`, the head-roles tables `results/{model}/heads.csv`, the "
                "scorecards and `results/report/findings.csv`), written here by `make demo-numbers` "
                "(`docs/demo-numbers.json`).")


def _arch(s: Mapping[str, Any]) -> str:
    lay = s.get("layout") or {}
    words = f"{ARCHITECTURES.get(s.get('architecture', 'gpt2'), s.get('architecture'))}, {lay.get('n_layer')} layers × " \
            f"{lay.get('n_head')} heads, d_model {lay.get('d_model')}"
    if s.get("architecture", "gpt2") in LAYOUT_WORDS:
        words += f": {LAYOUT_WORDS[s.get('architecture', 'gpt2')]}"
    if lay.get("silent_attention_layers"):
        layers = ", ".join(str(x) for x in lay["silent_attention_layers"])
        words += f"; layer-{layers} attention silent for the first {lay.get('silent_attention_steps')} steps"
    return words


def _induction(s: Mapping[str, Any]) -> str:
    reads = s.get("previous_token_heads_below") or [s.get("induction_reads_head")]
    return f"{s['best_induction_head']} {f3(s['best_induction_score'])} ({', '.join(str(r) for r in reads)})"


def _others(s: Mapping[str, Any]) -> str:
    """The other previous-token heads of at least half the best one's held-out score."""
    best = s.get("best_previous_token_head")
    scores = s.get("previous_token_scores") or []
    top = float(s.get("best_previous_token_score") or 0)
    rest = sorted(((float(x), f"L{li}H{hi}") for li, layer in enumerate(scores) for hi, x in enumerate(layer)
                   if f"L{li}H{hi}" != best and float(x) >= 0.5 * top), reverse=True)
    return f" ({', '.join(f'{h} {x:.2f}' for x, h in rest)})" if rest else ""


def readme_table(run: Run) -> list[str]:
    rows = ["| model | architecture | previous-token head (held-out previous-token score) | induction head "
            "(induction score; the previous-token heads it reads) | held-out loss |", "|---|---|---|---|---|"]
    for m in run.trained():
        s = run.summary(m)
        rows.append(f"| `{m}` | {_arch(s)} | {s['best_previous_token_head']} {f3(s['best_previous_token_score'])} | "
                    f"{_induction(s)} | {f3(s['heldout_loss'])} |")
    return rows + ["", run.provenance() + " " + VARIES]


def models_table(run: Run) -> list[str]:
    rows = ["| model | architecture | previous-token head (held-out previous-token score; others ≥ half of it) | "
            "induction head (induction score; reads) | induction score with the previous-token heads zeroed | "
            "P(correct) on the second copy (zeroed) | best held-out look-back-two score (no threshold) | "
            "held-out loss | training CPU s |", "|---|---|---|---|---|---|---|---|---|"]
    for m in run.trained():
        s = run.summary(m)
        rows.append(
            f"| `{m}` | {_arch(s)} | **{s['best_previous_token_head']} {f3(s['best_previous_token_score'])}**{_others(s)} | "
            f"**{_induction(s)}** | {f3(s.get('induction_score_with_previous_token_heads_ablated'))} | "
            f"{f3(s.get('p_correct_repeated'))} ({f3(s.get('p_correct_repeated_ablated'))}) | "
            f"{s.get('best_look_back_two_head')} {f3(s.get('best_look_back_two_score'))} | {f3(s['heldout_loss'])} | "
            f"{s.get('train_cpu_seconds', '—')} |")
    return rows + ["", run.provenance() + " The CPU seconds depend on the machine and its load. " + VARIES]


def findings_counts(run: Run) -> list[str]:
    out = []
    for m in run.trained():
        f = run.model(m).get("findings") or {}
        if not f:
            continue
        by = {v: [c for c, r in f.items() if r.get("verdict") == v]
              for v in ("holds", "holds on null", "fails", "not measurable")}
        out.append(f"- `{m}` ({len(f)} claims): holds {len(by['holds'])} ({', '.join(by['holds']) or '—'}), "
                   f"holds on null {len(by['holds on null'])} ({', '.join(by['holds on null']) or '—'}), "
                   f"fails {len(by['fails'])}, not measurable {len(by['not measurable'])}")
    return out + ["", f"(`results/report/findings.csv` of the `make demo` run of {run.date}; `make demo-numbers`.)"]


def twins_table(run: Run) -> list[str]:
    pairs = [(m, run.twin(m)) for m in run.trained() if run.twin(m)]
    pairs = [(m, t) for m, t in pairs if run.model(m).get("findings")]
    if not pairs:
        return ["No twin in the stored run."]
    claims: list[str] = []
    for m, _ in pairs:
        for c, r in run.model(m)["findings"].items():
            if (r.get("twin_verdict") == "holds" or c in ("P7", "P8")) and c not in claims:
                claims.append(c)
    head = "| claim | quantity | " + " | ".join(f"`{m}` | its twin" for m, _ in pairs) + " |"
    rows = [head, "|---|---|" + "---|---|" * len(pairs)]
    for c in claims:
        q = next((run.model(m)["findings"][c].get("quantity") for m, _ in pairs if c in run.model(m)["findings"]), "")
        cells = []
        for m, _ in pairs:
            r = run.model(m)["findings"].get(c) or {}
            cells += [_verdict(r.get("value"), r.get("verdict")), _verdict(r.get("twin_value"), r.get("twin_verdict"))]
        rows.append(f"| {c} | `{q}` | " + " | ".join(cells) + " |")
    lines = rows + [""]
    for m, _ in pairs:
        on_null = [c for c, r in run.model(m)["findings"].items() if r.get("verdict") == "holds on null"]
        structural = [c for c, r in run.model(m)["findings"].items() if r.get("origin") == "structural"]
        lines.append(f"Holds on the null on `{m}` (it passes the threshold, and its twin scores as well): "
                     f"{', '.join(on_null) or 'none'}; structural (true of any model): {', '.join(structural) or 'none'}.")
    for m, t in pairs:
        card = (run.model(t).get("scorecard") or {}).get("random_token_patterns")
        if card:
            lines.append(f"`{t}`'s best previous-token candidate scores {f3(card.get('previous_candidate_score'))} "
                         f"and its best induction candidate {f3(card.get('induction_candidate_score'))} on random "
                         "tokens.")
    return lines + ["", f"(`results/report/findings.csv` and the twins' scorecards of the `make demo` run of {run.date}, "
                    "written by `make demo-numbers`; a value with its verdict: ✓ holds, ✓◆ holds on null, ✗ fails.)"]


def _verdict(value: Any, verdict: Any) -> str:
    mark = {"holds": " ✓", "holds on null": " ✓◆", "fails": " ✗"}.get(str(verdict), "")
    if value is None:
        return "n/m" if verdict == "not measurable" else "—"
    v = float(value)
    return (f"{v:g}" if v == int(v) else f3(v)) + mark


#: a line per P rule quoting its scorecard (``{name}``: the quantity, 3 decimals; ``damage_sharp``:
#: the damage of the sharp head; ``{sharp}``: its name)
P_LINES = (
    ("prev_knockout", "- P5: knocking out layer 0's attention to the previous position: {sharp}'s previous-token "
     "mass {prev_token_mass_intact} → {prev_token_mass_knockout} (at the knocked-out queries, knocked out / intact "
     "{prev_token_mass_ratio_knocked})"),
    ("extended_averaging", "- P15: averaging the positional embeddings just before {sharp}'s layer: its damage "
     "(relative drop of its previous-token mass) {damage_sharp}; early minus sharp damage {early_minus_sharp_damage}"),
    ("repeated_tokens", "- P14: {sharp}'s previous-token mass {prev_token_mass_other} at other queries, "
     "{prev_token_mass_repeat} where a character repeats (blip {repeat_token_blip})"),
    ("induction_intervention", "- P16: P(Ram) {p_ram_baseline} at baseline; with {sharp} redirected and its output "
     "doubled, P(Ewe) {p_ewe_after} and P(Ram) {p_ram_after}; the redirect alone: P(Ram) {p_ram_redirect_only}, "
     "P(Ewe) {p_ewe_redirect_only}"),
)


class _Fields(dict):  # type: ignore[type-arg]
    """A line's values; a quantity the scorecard lacks reads —."""

    def __init__(self, values: Mapping[str, str], **more: str) -> None:
        super().__init__(values, **more)

    def __missing__(self, key: str) -> str:
        return "—"


def p_rules(run: Run, model: str = "demo") -> list[str]:
    e = run.model(model)
    heads = e.get("heads") or {}
    card = e.get("scorecard") or {}
    sharp = next((h for h, r in heads.items() if r.get("p7_chosen") == "sharp"), None)
    if not heads:
        return [f"No taxonomy of `{model}` in the stored run."]
    if sharp is None:
        return [f"- P7: no head of `{model}` is a previous-token head above the uniform baseline (P6), so none is "
                "the sharp one (the interventions read the taxonomy's fallback head, which holds no role)"]
    early = sorted(float(r["diagonal_ratio"]) for h, r in heads.items() if r.get("p7_chosen") == "early")
    out = [f"- P7: the sharp head is {sharp}, diagonal ratio {f3(heads[sharp].get('diagonal_ratio'))}; its "
           f"previous-token mass {f3(heads[sharp].get('prev_token_mass'))}"
           + (f"; the {len(early)} early heads' ratios {f3(early[0])}–{f3(early[-1])}" if early else "")]
    for analysis, line in P_LINES:
        values = card.get(analysis)
        if values:
            fields = {k.replace(sharp, "sharp"): f3(v) for k, v in values.items()}
            out.append(line.format_map(_Fields(fields, sharp=sharp)))
    return out + ["", f"(`results/{model}/heads.csv` and `results/{model}/scorecard/` of the `make demo` run of "
                  f"{run.date}, written by `make demo-numbers`.)"]


def baseline_table(run: Run) -> list[str]:
    """P6 by the post's definition and against the uniform baseline, on each trained model and its twin."""
    rows = ["| model | P6, post's definition | P6, over the baseline | its heads (excess) | P7 ratio (sharpest) "
            "| P6 / P7 verdicts |", "|---|---|---|---|---|---|"]
    for m in run.trained():
        for name, of in ((m, None), (run.twin(m), m)):
            if name is None:
                continue
            e = run.model(name)
            card = (e.get("scorecard") or {}).get("diagonal_taxonomy") or {}
            heads = e.get("heads") or {}
            if not card or not heads:
                continue
            n = len(heads)
            prev = sorted(((h, r) for h, r in heads.items() if r.get("previous_token") in (True, "True")),
                          key=lambda x: -float(x[1].get("prev_token_excess", 0)))
            listed = ", ".join(f"{h} {f3(r.get('prev_token_excess'))}" for h, r in prev)
            if not listed:
                excess = [float(r["prev_token_excess"]) for r in heads.values() if "prev_token_excess" in r]
                listed = f"— (largest excess {max(excess):.2g})" if excess else "—"
            sharp = next((h for h, r in heads.items() if r.get("p7_chosen") == "sharp"), None)
            ratio = f"{f3(heads[sharp].get('diagonal_ratio'))} ({sharp})" if sharp and prev else "—"
            f = (run.model(of or m).get("findings") or {})
            key = "verdict" if of is None else "twin_verdict"
            verdicts = " / ".join(str((f.get(c) or {}).get(key) or "—") for c in ("P6", "P7"))
            post, new = card.get("n_prev_token_heads_post"), card.get("n_prev_token_heads")
            rows.append(f"| `{name}` | {post:g} of {n} ({f3(card.get('prev_token_head_fraction_post'))}) | "
                        f"{new:g} of {n} ({f3(card.get('prev_token_head_fraction'))}) | {listed} | {ratio} | "
                        f"{verdicts} |" if post is not None and new is not None else f"| `{name}` | — | — | — | — | — |")
    if len(rows) == 2:
        return ["No taxonomy in the stored run."]
    return rows + ["", f"(`results/{{model}}/heads.csv`, the `diagonal_taxonomy` scorecards and "
                   f"`results/report/findings.csv` of the `make demo` run of {run.date}, written by "
                   "`make demo-numbers`.)"]


#: every block: its name (after ``numbers.``) and what writes it
BLOCKS = {"readme-table": readme_table, "models-table": models_table, "findings-counts": findings_counts,
          "twins": twins_table, "p-rules": p_rules, "baseline": baseline_table}


def block(run: Run, name: str) -> list[str] | None:
    """The lines of block ``name`` (``None``: another generator's block)."""
    if not name.startswith(PREFIX):
        return None
    write = BLOCKS.get(name[len(PREFIX):])
    if write is None:
        raise PosmechError(f"`<!-- generated: {name} -->`: no such block (posmech.pipeline.demo_numbers: "
                           f"{', '.join(PREFIX + b for b in BLOCKS)})")
    return write(run)


def read(path: Path = NUMBERS) -> Run:
    try:
        return Run(json.loads(Path(path).read_text(encoding="utf-8")))
    except (OSError, ValueError) as err:
        raise PosmechError(f"{path}: unreadable ({err}); run {COMMAND}") from None


def written(run: Run | None = None, docs: Iterable[Path] = DOCS) -> dict[Path, str]:
    """Each doc with a ``numbers.…`` block and its text written from ``run`` (default: the stored one)."""
    run = run or read()
    out: dict[Path, str] = {}
    for path in docs:
        text = path.read_text(encoding="utf-8")
        if not any(n.startswith(PREFIX) for n in _names(text)):
            continue
        where = _rel(path)
        out[path] = fill_blocks(text, where, lambda name: block(run, name))
    return out


def _names(text: str) -> list[str]:
    return [m.group(1) for line in text.split("\n") if (m := BEGIN.match(line))]


def stale(run: Run | None = None) -> list[Path]:
    return changed(written(run))


# --------------------------------------------------------------------------- typed numbers
def outside_blocks(text: str) -> list[tuple[int, str]]:
    """``(line number, line)`` of ``text`` outside every generated block, outside the sections
    of :data:`PUBLISHED_SECTIONS` and outside paragraphs marked ``<!-- history: … -->``."""
    lines = text.split("\n")
    out: list[tuple[int, str]] = []
    inside = published = False
    para: list[tuple[int, str]] = []

    def flush() -> None:
        if para and not any(HISTORY.search(x) for _, x in para):
            out.extend(para)
        para.clear()

    for i, line in enumerate(lines, 1):
        if BEGIN.match(line):
            inside = True
        if line.startswith("## "):
            published = bool(PUBLISHED_SECTIONS.match(line))
        if not inside and not published:
            if line.strip():
                para.append((i, line))
            else:
                flush()
        if line == END:
            inside = False
    flush()
    return out


DECIMAL3 = re.compile(r"(?<![\d.–-])\d+\.\d{3}(?![\d–])")


def _values(x: Any) -> Iterable[float]:
    if isinstance(x, bool):
        return
    if isinstance(x, (int, float)):
        yield float(x)
    elif isinstance(x, list):
        for v in x:
            yield from _values(v)
    elif isinstance(x, dict):
        for v in x.values():
            yield from _values(v)


def stored_values(run: Run) -> set[str]:
    """The stored run's numbers as the docs print them (3 decimals), but for the round ones
    and those below 0.01 (0.003, 0.500, 1.000, …: too common to be telling)."""
    return {t for v in _values(run.data["models"])
            if not ((t := f"{v:.3f}").endswith(("00", "50")) or t.startswith(("0.00", "-0.00")))}


def typed_run_numbers(docs: Iterable[Path] = DOCS, run: Run | None = None) -> list[str]:
    """``file:line: text`` of each number outside the blocks that looks like a run's: a head,
    a claim, a held-out loss or a probability followed by a decimal not in a range, or a
    3-decimal number that is one of the stored run's (``run``, default :data:`NUMBERS`)."""
    values = stored_values(run or read())
    found = []
    for path in docs:
        if path.name in MEASUREMENT_DOCS:
            continue
        for n, line in outside_blocks(path.read_text(encoding="utf-8")):
            spans = []
            for m in RUN_NUMBER.finditer(line):
                found.append(f"{_rel(path)}:{n}: {m.group(0)!r}")
                spans.append(m.span("num"))
            for m in DECIMAL3.finditer(line):
                if m.group(0) in values and m.span() not in spans:
                    found.append(f"{_rel(path)}:{n}: {m.group(0)!r} (a number of the stored run)")
    return found


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--from-run"]:
        if len(args) < 2:
            print("usage: python -m posmech.pipeline.demo_numbers --from-run RESULTS [CONFIG]", file=sys.stderr)
            return 2
        try:
            data = collect(Path(args[1]), Path(args[2]) if len(args) > 2 else DEMO_CONFIG)
        except PosmechError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        NUMBERS.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        print(f"wrote {_rel(NUMBERS)}")
        args = ["--write"]
    return generator_main(args, "python -m posmech.pipeline.demo_numbers", __doc__, written,
                          "the docs' blocks of the demo run's numbers", "docs/demo-numbers.json", WRITE_COMMAND)


if __name__ == "__main__":
    sys.exit(main())
