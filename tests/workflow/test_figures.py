"""The figure check (posmech.plots.check) on every figure of the CI-sized run: each PNG
carries the check ``posmech.plots.save`` ran on it, and none reports a problem."""

from __future__ import annotations

from PIL import Image

from posmech.plots.check import read_check


def test_every_figure_of_the_run_passes_the_figure_check(ci_run):
    figures = sorted(p for p in (ci_run / "results").rglob("*.png") if "report" not in p.parts)
    assert len(figures) >= 30, [str(p) for p in figures]
    failures = {}
    for path in figures:
        check = read_check(path)
        with Image.open(path) as im:
            width = im.size[0]
        # the check measured the figure it wrote: its width (the font shrink depends on it)
        assert abs(check["width_px"] - width) <= 0.05 * width, (path, check["width_px"], width)
        if check["problems"]:
            failures[str(path.relative_to(ci_run))] = check["problems"]
    assert not failures, "\n".join(f"{p}: {msg}" for p, msgs in failures.items() for msg in msgs)


def test_heatmap_annotations_were_checked(ci_run):
    """L1's heat maps write numbers on their cells: the check read every one back."""
    check = read_check(ci_run / "results/demo/attn_only/random_token_patterns.png")
    assert check["n_annotations"] >= 10 and not check["problems"]
