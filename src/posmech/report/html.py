"""The final HTML report: findings grid and scorecard first, the head roles across models,
the demo models and the training dynamics, one section per claim family, then the run.

``results/report/index.html`` plus a sibling ``figures/`` folder holding copies of every
figure and table it shows (relative links only, one small inline script, no CDN): the folder can
be copied or mailed and opened offline.  Everything shown comes from named inputs:

* the scorecard (:mod:`posmech.verdicts.scorecard`) from ``resources/published.yaml`` and the
  ``results/{model}/scorecard/<rule>.csv`` files;
* figures and tables registered by the stages, with the rst caption and category of
  their rule's ``report(...)`` flag (rendered with ``snakemake.wildcards`` and
  ``snakemake.config``, like Snakemake's native report);
* the trained models' ``summary.json`` (training curve, previous-token head found);
* the run: config, model manifests, token-file sizes, package versions, git commit and
  the wall time of every job from ``benchmarks/**.tsv``.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from posmech.core import names
from posmech.core.errors import PosmechError
from posmech.core.io import atomic_path
from posmech.verdicts import scorecard as sc
from posmech.store.tables import meta_path, read_table

TEMPLATE = "report.html.j2"
CLAIM_ID = re.compile(r"\b([PLKCS])(\d{1,2})\b")
PUBLISHED_MODELS_NOTE = (
    "Published values are those of the source posts and belong to the model each was measured on "
    "({models}). A value is judged only on that model, or on any model for a property that must hold "
    "for every model; what this run's other models do is listed compactly after the judged rows."
)
VERSION_PACKAGES = (
    "posmech", "torch", "transformer_lens", "transformers", "tokenizers", "datasets", "h5py", "numpy",
    "scipy", "pandas", "matplotlib", "snakemake", "jinja2", "docutils",
)


@dataclass
class Asset:
    """A figure or table shown in the report."""

    source: str  # path in the working directory
    href: str  # relative to index.html
    anchor: str
    kind: str  # "figure" | "table"
    family: str  # P, L, K, C, demo, other
    title: str
    caption_html: str = ""
    category: str = ""
    rule: str = ""
    claims: list[str] = field(default_factory=list)
    table_html: str = ""
    n_rows: int = 0
    pair: str = ""  # anchor of the figure this table belongs to (caption shown there)
    model: str = ""  # the model it shows (results/{model}/…); "" for a figure of several models
    twin_of: str = ""  # a random-init twin's model (config models.<m>.twin_of)
    twin_kind: str = "random-init"  # which null the twin is: "random-init" or "shuffled" (twins.weights)
    checkpoint: str = ""  # which checkpoint of which model, in words ("step 300 of demo"), or ""


def slug(path: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", str(path)).strip("-").lower()


def claims_in(*texts: str) -> list[str]:
    """Claim IDs mentioned in ``texts`` (``P4``, ``K10``), in order, without repeats."""
    found = [f"{m.group(1)}{m.group(2)}" for t in texts for m in CLAIM_ID.finditer(t or "")]
    return list(dict.fromkeys(found))


def rst_to_html(text: str) -> str:
    """An rst caption as an HTML fragment (docutils; errors are reported inline, not raised)."""
    from docutils.core import publish_parts

    parts = publish_parts(
        text, writer="html5",
        settings_overrides={"report_level": 4, "halt_level": 5, "embed_stylesheet": False,
                            "input_encoding": "unicode", "syntax_highlight": "none"},
    )
    return parts["body"]


class _Namespace(dict):
    """``snakemake.wildcards.model`` and ``snakemake.wildcards["model"]`` for captions."""

    def __getattr__(self, key: str) -> Any:
        try:
            return self[key]
        except KeyError:
            raise AttributeError(key) from None


def render_caption(path: str | None, wildcards: dict[str, str], config: dict[str, Any]) -> str:
    """Render an rst caption file like Snakemake does (Jinja2 with ``snakemake``), to HTML."""
    if not path:
        return ""
    import jinja2
    from markupsafe import Markup

    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise PosmechError(f"caption {path!r} cannot be read ({err}); fix the report(caption=…) path") from None
    env = jinja2.Environment(undefined=jinja2.ChainableUndefined, autoescape=False)
    smk = _Namespace(wildcards=_Namespace(wildcards), config=config, params=_Namespace(), output=[], input=[])
    try:
        text = env.from_string(text).render(snakemake=smk)
    except jinja2.TemplateError as err:
        text = f"{text}\n\n(caption template error: {err})"
    return rst_to_html(text)


def copy_asset(src: str, figures_dir: Path) -> str:
    """Copy ``src`` into ``figures_dir`` (keeping its path below ``results/``); the href
    relative to the report."""
    rel = Path(src)
    if rel.is_absolute():
        rel = Path(*rel.parts[1:])
    if rel.parts and rel.parts[0] == "results":
        rel = Path(*rel.parts[1:])
    dest = figures_dir / rel
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dest)
    return f"{figures_dir.name}/{rel.as_posix()}"


def claims_catalogue_html(path: str | os.PathLike[str]) -> str:
    """``docs/claims.md`` as an HTML fragment (markdown-it, tables enabled) whose table rows
    of a claim carry the anchor ``claim-<ID>`` (the scorecard links there); headings one
    level down (the report's section is the ``h2``)."""
    from markdown_it import MarkdownIt

    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise PosmechError(f"claims catalogue {str(path)!r} cannot be read ({err}); it ships as docs/claims.md") from None
    text = re.sub(r"\A# .*\n", "", text)  # the document title: the report has its own
    text = re.sub(r"^<!-- [^\n]* -->\n", "", text, flags=re.M)  # the generated tables' markers
    html = MarkdownIt("commonmark", {"html": False}).enable("table").render(text)
    html = re.sub(r"<h([1-4])>", lambda m: f"<h{int(m.group(1)) + 2}>", html)
    html = re.sub(r"</h([1-4])>", lambda m: f"</h{int(m.group(1)) + 2}>", html)
    seen: set[str] = set()

    def anchor(m: re.Match[str]) -> str:
        cell, cid = m.group(1), m.group(2)
        if cid in seen:
            return m.group(0)
        seen.add(cid)
        return f'<tr id="claim-{cid}">\n<td>{cell}'

    return re.sub(r"<tr>\n<td>((?:<strong>)?([PLKCS]\d{1,2})(?:</strong>)?)", anchor, html)


def _family_of(claims: list[str], category: str, path: str) -> str:
    if claims:
        return sc.family(claims[0])
    if "/training/" in path or "demo" in category.lower():
        return "demo"
    return "other"


def model_of(path: str, models: dict[str, Any]) -> str:
    """The model a figure or table of ``results/{model}/…`` shows: its folder below
    ``results/`` when that is a model of the run (``models``: the config's); ``""`` for a
    report-level file showing several models (``results/kernels/etc_heatmap.png``)."""
    parts = Path(path).parts
    i = parts.index("results") if "results" in parts else -1
    return parts[i + 1] if 0 <= i < len(parts) - 2 and parts[i + 1] in models else ""


def model_marks(model: str, models: dict[str, Any]) -> dict[str, str]:
    """What the report says about ``model`` beside its name: ``twin_of`` (a twin,
    :mod:`posmech.models.twin`: the model whose architecture it copies), ``twin_kind`` (its
    null, config ``twins.weights``: ``random-init``, or ``shuffled``: its model's weights with
    each tensor's entries permuted) and ``checkpoint`` (a
    trained model's saved step, ``step 300 of demo``, or a Hub model's revision other than
    ``main``, ``revision step3000``)."""
    entry = models.get(model) or {}
    twin_of = str(entry.get("twin_of") or "")
    if entry.get("checkpoint_of"):
        step = entry.get("step")
        checkpoint = (f"step {step} of {entry['checkpoint_of']}" if step is not None
                      else f"checkpoint of {entry['checkpoint_of']}")
    elif not twin_of and "train" not in entry and entry.get("revision") not in (None, "", "main"):
        checkpoint = f"revision {entry['revision']}"
    else:
        checkpoint = ""
    kind = "shuffled" if entry.get("twin_weights") == "shuffled" else "random-init"
    return {"twin_of": twin_of, "twin_kind": kind, "checkpoint": checkpoint}


def asset_order(models: dict[str, Any]) -> Any:
    """Sort key of a family's assets: by claim, then by file (the same figure of every model
    together), then by model in the config's order with each random-init twin right after
    its model (a trained model and its twin side by side), report-level files first."""
    order = list(models)

    def rank(m: str) -> tuple[int, int]:
        base = str((models.get(m) or {}).get("twin_of") or m)
        return (order.index(base) if base in order else len(order), 1 if base != m else 0)

    def key(a: Asset) -> tuple[Any, ...]:
        rel = Path(a.source).parts[2:] if a.model else Path(a.source).parts[1:]
        return (sc.claim_sort_key(a.claims[0]) if a.claims else (99, 0, ""), "/".join(rel),
                rank(a.model) if a.model else (-1, 0))

    return key


def model_label(a: Asset) -> Any:
    """The model an asset shows, as the report prints it on the thumbnail: its name in bold,
    a badge for a checkpoint (``step 300 of demo``) and one for a random-init twin (``random-init
    twin of demo``); "several models" for a report-level figure."""
    from markupsafe import Markup, escape

    if not a.model:
        return Markup('<span class="model-name">several models</span>')
    out = f'<span class="model-name">{escape(a.model)}</span>'
    if a.checkpoint:
        out += f' <span class="badge ckpt">{escape(a.checkpoint)}</span>'
    if a.twin_of:
        out += f' <span class="badge twin">{escape(a.twin_kind)} twin of {escape(a.twin_of)}</span>'
    return Markup(out)


def table_html(path: str, max_rows: int = 15) -> tuple[str, int]:
    """The first rows of a tidy table as an HTML table (escaped), and its row count (a table
    changed after it was written is refused: :func:`posmech.store.tables.read_table`)."""
    df = read_table(path)
    return df.head(max_rows).to_html(index=False, border=0, classes="data", na_rep="", escape=True,
                                     float_format=lambda x: f"{x:.4g}"), len(df)


def collect_assets(figures: list[str], tables: list[str], flags: dict[str, dict[str, Any]],
                   config: dict[str, Any], figures_dir: Path) -> list[Asset]:
    """Copy figures and tables next to the report and render their captions; each names its
    model (:func:`model_of`), and whether that is a random-init twin or a checkpoint
    (:func:`model_marks`). A failure record (:mod:`posmech.core.failures`) is left out."""
    from posmech.core.failures import failure_of

    models = config.get("models") or {}
    out = []
    for kind, paths in (("figure", figures), ("table", tables)):
        for p in paths:
            if failure_of(p) is not None:  # a failed analysis's: its findings say so (findings.csv)
                continue
            flag = flags.get(p) or {}
            caption = render_caption(flag.get("caption"), flag.get("wildcards") or {}, config)
            category = flag.get("category") or ""
            plain = re.sub(r"<[^>]+>", " ", caption)
            claims = claims_in(category, plain, Path(p).name)
            a = Asset(source=p, href=copy_asset(p, figures_dir), anchor=f"{kind}-{slug(p)}", kind=kind,
                      family=_family_of(claims, category, p), title=p, caption_html=caption,
                      category=category, rule=flag.get("rule", ""), claims=claims)
            a.model = model_of(p, models)
            if a.model:
                marks = model_marks(a.model, models)
                a.twin_of, a.twin_kind, a.checkpoint = marks["twin_of"], marks["twin_kind"], marks["checkpoint"]
            if kind == "table":
                a.table_html, a.n_rows = table_html(p)
                if meta_path(p).is_file():
                    copy_asset(str(meta_path(p)), figures_dir)
            out.append(a)
    return out


def _same_caption(table: Asset, figure: Asset) -> bool:
    """Same rendered caption, same model folder (``results/<model>/…``)."""
    return bool(table.caption_html) and table.caption_html == figure.caption_html and \
        Path(table.source).parts[:2] == Path(figure.source).parts[:2]


def pair_tables(assets: list[Asset]) -> list[Asset]:
    """Order ``assets`` so that a table whose caption is a figure's caption (same caption
    text, same model) follows that figure, and drop the repeated caption: the table then
    points to its figure (``pair``) instead of printing the same text twice."""
    figures = [a for a in assets if a.kind == "figure"]
    out: list[Asset] = []
    placed: set[int] = set()
    for a in assets:
        if id(a) in placed:
            continue
        if a.kind == "table" and any(_same_caption(a, f) for f in figures):
            continue  # placed after its figure below
        out.append(a)
        placed.add(id(a))
        if a.kind == "figure":
            for t in assets:
                if t.kind == "table" and id(t) not in placed and _same_caption(t, a):
                    t.pair, t.caption_html = a.anchor, ""
                    out.append(t)
                    placed.add(id(t))
    return out


def read_benchmarks(root: str | os.PathLike[str]) -> pd.DataFrame:
    """Every Snakemake benchmark file below ``root`` (``benchmarks/<rule>/<job>.tsv``):
    columns ``rule, job, seconds, max_rss_mb`` (last repeat of each file)."""
    rows = []
    base = Path(root)
    for f in sorted(base.rglob("*.tsv")) if base.is_dir() else []:
        try:
            df = pd.read_csv(f, sep="\t")
        except (OSError, ValueError, pd.errors.EmptyDataError):
            continue
        if df.empty or "s" not in df.columns:
            continue
        last = df.iloc[-1]
        rel = f.relative_to(base)
        rows.append({
            "rule": rel.parts[0] if len(rel.parts) > 1 else f.stem,
            "job": "/".join(rel.with_suffix("").parts[1:]) or f.stem,
            "seconds": float(last["s"]),
            "max_rss_mb": float(last["max_rss"]) if "max_rss" in df.columns and str(last["max_rss"]) != "-" else math.nan,
        })
    return pd.DataFrame(rows, columns=["rule", "job", "seconds", "max_rss_mb"])


def corpus_sizes(token_paths: list[str]) -> list[dict[str, Any]]:
    """``model, corpus, n_documents, n_tokens`` of each token file."""
    import h5py

    out = []
    for p in token_paths:
        path = Path(p)
        with h5py.File(path, "r") as f:
            out.append({"model": path.parent.parent.name, "corpus": path.stem,
                        "n_documents": int(f.attrs.get("n_documents", -1)),
                        "n_tokens": int(f.attrs.get("n_tokens", -1))})
    return out


def package_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for pkg in VERSION_PACKAGES:
        try:
            out[pkg] = version(pkg.replace("_", "-"))
        except PackageNotFoundError:
            out[pkg] = "not installed"
    return out


DEMO_TABLES = [
    ("previous_token_scores", "best_previous_token_head",
     f"{names.HELDOUT_PREV_SCORE.capitalize()}: {names.WORDS[names.HELDOUT_PREV_SCORE][1]}, per head (best highlighted)"),
    ("look_back_two_scores", "best_look_back_two_head",
     f"{names.HELDOUT_LOOK_BACK_TWO.capitalize()}: {names.WORDS[names.HELDOUT_LOOK_BACK_TWO][1]}, per head (best "
     "highlighted; no threshold)"),
    ("induction_scores", "best_induction_head", "Induction score: on [BOS] + R + R (R random characters), mean "
     "attention from the second copy to the character after the previous occurrence (best in a layer ≥ 1 highlighted)"),
]


def _head_tuple(name: str | None) -> tuple[int, int] | None:
    return (int(name[1:].split("H")[0]), int(name.split("H")[1])) if name else None


def _head_measures(table: pd.DataFrame | None, best_head: str | None) -> dict[str, Any]:
    """What the model's head-roles table says of the summary's best previous-token head
    (``prev_mass``: its previous-token mass) and of the look-back-two role (``look_back``:
    ``{"head", "score", "below"}``, ``below`` when no head passes and ``head`` is the best
    candidate, below threshold; ``None`` when the L rules did not run on the model)."""
    from posmech.report.head_roles import ROLES, best_candidate, holders

    out: dict[str, Any] = {"prev_mass": None, "look_back": None}
    if table is None:
        return out
    row = table[table["head_name"].astype(str) == str(best_head)] if "prev_token_mass" in table else table.iloc[:0]
    if len(row) and pd.notna(row["prev_token_mass"].iloc[0]):
        out["prev_mass"] = float(row["prev_token_mass"].iloc[0])
    role = next(r for r in ROLES if r.value == "look_back_two")
    found = holders(table, role)
    if found:
        out["look_back"] = {"head": found[0][0], "score": found[0][1], "below": False}
    elif found == [] and (best := best_candidate(table, role)) is not None:
        out["look_back"] = {"head": best[0], "score": best[1], "below": True}
    return out


def demo_sections(summaries: list[str], curves: dict[str, Asset],
                  heads: dict[str, pd.DataFrame] | None = None) -> list[dict[str, Any]]:
    """Per trained model: its training summary, the curve figure and its per-head score
    tables (held-out previous-token, look-back-two and induction scores; ``[layer][head]``) with
    the best heads; from its head-roles table (``heads[model]``, when given) the best head's
    previous-token mass and the look-back-two role (:func:`_head_measures`): each measure under
    its own name (:mod:`posmech.core.names`)."""
    heads = heads or {}
    out = []
    for p in summaries:
        s = json.loads(Path(p).read_text(encoding="utf-8"))
        model = s.get("model") or Path(p).parent.parent.name
        tables = [
            {"key": key, "caption": caption, "best": _head_tuple(s.get(best)),
             "scores": [[f"{x:.3f}" for x in layer] for layer in s[key]]}
            for key, best, caption in DEMO_TABLES if s.get(key)
        ]
        out.append({
            "model": model, "summary": s, "curve": curves.get(model),
            "best_head": s.get("best_previous_token_head"), "best_score": s.get("best_previous_token_score"),
            "tables": tables,
            "scores": tables[0]["scores"] if tables else [], "best": tables[0]["best"] if tables else None,
            **_head_measures(heads.get(model), s.get("best_previous_token_head")),
        })
    return out


def study_models() -> list[str]:
    """The models of the full study (``config/config.yaml`` of the repository), named on the
    banner of a run that has none of the posts' models."""
    path = Path(__file__).resolve().parents[3] / "config" / "config.yaml"
    try:
        return list((yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("models", {}))
    except OSError:  # an installed package without the repository: the posts' models' names instead
        return []


def _display_path(path: str) -> str:
    """``path`` relative to the repository when it lies in it (``resources/published.yaml``)."""
    repo = Path(__file__).resolve().parents[3]
    try:
        return Path(path).resolve().relative_to(repo).as_posix()
    except ValueError:
        return str(path)


def dynamics_section(table: str, figure: str | None, figures_dir: Path) -> Any:
    """The "Training dynamics" section from ``dynamics.csv`` at ``table`` and its figure, both
    copied next to the report (with the table's metadata sidecar)."""
    from posmech.report.dynamics_section import dynamics_html
    from posmech.store.tables import read_table

    if meta_path(table).is_file():
        copy_asset(str(meta_path(table)), figures_dir)
    return dynamics_html(read_table(table), copy_asset(figure, figures_dir) if figure else None,
                         copy_asset(table, figures_dir))


def build(
    *, html: str, figures_dir: str, scorecard_csv: str, published: str, scorecards: list[str],
    figures: list[str], tables: list[str], summaries: list[str], manifests: list[str],
    tokens: list[str], flags: dict[str, dict[str, Any]], config: dict[str, Any], benchmarks: str,
    claims: str | None = None, findings: str | None = None, heads: list[str] | None = None,
    dynamics: str | None = None, dynamics_figure: str | None = None,
) -> dict[str, Any]:
    """Write the scorecard CSV and the HTML report; returns the status counts.

    ``claims``: the claims catalogue (``docs/claims.md``), rendered at the end of the report;
    the scorecard's claim IDs link to its rows.  ``findings``: ``results/report/findings.csv``
    (rule ``findings``), drawn as the grid at the top (:mod:`posmech.report.findings_grid`).
    ``heads``: the models' head-roles tables ``results/{model}/heads.csv`` (rule ``head_table``),
    drawn as the cross-model head-roles view below the scorecard (:mod:`posmech.report.head_roles`).
    ``dynamics``: ``results/report/dynamics.csv`` (rule ``dynamics``, the followed findings at each
    checkpoint) and ``dynamics_figure`` its PNG: the "Training dynamics" section after the demo
    models (:mod:`posmech.report.dynamics_section`); no section without the table."""
    import jinja2
    from markupsafe import Markup

    from posmech.store.hdf5 import git_commit
    from posmech.report.findings_grid import grid_html
    from posmech.report.head_roles import read_roles, read_tables
    from posmech.report.selfcheck_table import selfcheck_html
    from posmech.verdicts import selfcheck as sc_cases
    from posmech.store.tables import read_table, write_table

    entries = sc.load_published(published)
    rows = sc.read_scorecards(scorecards)
    card = sc.build_scorecard(entries, rows, sc.registered_rules(scorecards))
    counts = {s: int((card.status == s).sum()) for s in sc.STATUSES}
    from posmech.core.io import file_sha256

    # the published values by content, not by a path that depends on the working directory
    write_table(card, scorecard_csv, {"published": "resources/published.yaml",
                                      "published_sha256": file_sha256(published), "counts": counts})
    found = read_table(findings) if findings else None  # the grid and the self-check block both show it

    fdir = Path(figures_dir)
    if fdir.exists():
        shutil.rmtree(fdir)
    fdir.mkdir(parents=True)
    assets = collect_assets(figures, tables, flags, config, fdir)
    by_source = {a.source: a for a in assets}

    def link(art: str) -> dict[str, str] | None:
        if art in by_source:
            return {"href": f"#{by_source[art].anchor}", "label": Path(art).name}
        if art and Path(art).is_file():
            return {"href": copy_asset(art, fdir), "label": Path(art).name}
        return None

    card_rows = [dict(r, link=link(r["artifact"])) for r in card.to_dict("records")]
    judged = [r for r in card_rows if sc.is_judged(r)]
    compact = [dict(e, link=link(e["artifact"])) for e in sc.compact_rows(card)]

    curves = {Path(a.source).parent.parent.name: a for a in assets if a.source.endswith("training/curve.png")}
    families = []
    for key, title in [*sc.FAMILIES.items(), ("other", "Other results")]:
        fam_assets = pair_tables(sorted((a for a in assets if a.family == key),
                                        key=asset_order(config.get("models") or {})))
        fam_rows = [r for r in card_rows if r["family"] == key]
        if fam_assets or fam_rows or key in sc.FAMILIES:
            families.append({"key": key, "title": title, "assets": fam_assets, "rows": fam_rows,
                             "claims": sorted({r["claim"] for r in fam_rows}, key=sc.claim_sort_key)})

    # the run's models, not the checkpoints of its dynamics sweep (shown in their own section)
    run_models = [m for m, e in config.get("models", {}).items() if "checkpoint_of" not in (e or {})]
    claims_html = claims_catalogue_html(claims) if claims else ""
    published_models = sorted({e.model for e in entries})
    bench = read_benchmarks(benchmarks)
    manifests_data = [json.loads(Path(p).read_text(encoding="utf-8")) for p in manifests]
    context = {
        "title": "posmech report",
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": git_commit(),
        "run_models": run_models,
        "published_models": published_models,
        "foreign_run": not set(run_models) & set(published_models),
        "study_models": study_models() or published_models,
        "status_meanings": sc.STATUS_MEANINGS,
        "published_note": PUBLISHED_MODELS_NOTE.format(models=", ".join(published_models)),
        "counts": counts,
        "card": card_rows,
        "judged": judged,
        "compact": compact,
        "claims_html": claims_html,
        "claim_href": lambda c: f"#claim-{c}" if f'id="claim-{c}"' in claims_html
        else f"#family-{sc.family(c) if sc.family(c) in sc.FAMILIES else 'other'}",
        "uncovered": sc.uncovered_claims(entries, card),
        "families": families,
        "model_label": model_label,
        "family_names": sc.FAMILIES,
        "demo": demo_sections(summaries, curves, read_tables(heads)[0] if heads else None),
        "names": names,
        "manifests": manifests_data,
        "corpora": corpus_sizes(tokens),
        "config_yaml": yaml.safe_dump(config, sort_keys=False, default_flow_style=False),
        "versions": package_versions(),
        "benchmarks": bench.to_dict("records"),
        "bench_total": float(bench.seconds.sum()) if len(bench) else 0.0,
        "bench_by_rule": bench.groupby("rule", sort=False).seconds.agg(["count", "sum"]).reset_index()
        .sort_values("sum", ascending=False).to_dict("records") if len(bench) else [],
        "scorecard_href": os.path.relpath(scorecard_csv, Path(html).parent),
        "published_path": _display_path(published),
        "findings_grid": grid_html(found) if found is not None else Markup(""),
        "selfcheck_table": selfcheck_html(found, sc_cases.expected_verdicts() if (config.get("selfcheck") or {}).get("cases") else None)
        if found is not None else Markup(""),
        "head_roles": read_roles(heads, run_models, copy=lambda p: copy_asset(p, fdir)),
        "dynamics": dynamics_section(dynamics, dynamics_figure, fdir) if dynamics else Markup(""),
    }
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("posmech.report", "templates"), autoescape=jinja2.select_autoescape(["html", "j2"]),
        undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
    )
    text = env.get_template(TEMPLATE).render(**context)
    with atomic_path(html) as tmp:
        Path(tmp).write_text(text, encoding="utf-8")
    return counts
