"""The P12 triptych (posmech.plots.anatomy.score_triptychs), laid out by hand: every text
inside the figure, no colour bar's labels over the next panel, one query axis per row, and
the figure check passing, on score matrices of known shape (a dark diagonal, a bright
sub-diagonal) at scales that give narrow and wide tick labels."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from PIL import Image  # noqa: E402

from posmech.analyses import anatomy as sa  # noqa: E402
from posmech.plots import DPI  # noqa: E402
from posmech.plots import anatomy  # noqa: E402
from posmech.plots.check import read_check  # noqa: E402


def _panels(n: int, scale: float) -> list[tuple[str, str, np.ndarray, np.ndarray, np.ndarray]]:
    """A sharp head (bright sub-diagonal) and an early head (later keys higher, itself
    suppressed), raw scores times ``scale``."""
    i = np.arange(n)
    offset = i[None, :] - i[:, None]
    out = []
    for head, role, raw in (("L1H0", "sharp", 4.0 * (offset == -1)), ("L0H3", "early", offset - 3.0 * np.eye(n))):
        raw = (scale * raw).astype(np.float32)
        masked = sa.masked_scores(raw)
        out.append((head, role, raw, masked, sa.softmax_rows(masked)))
    return out


def _drawn(monkeypatch, panels, zoom: bool, title: str):
    """The figure as save() gets it (drawn, not yet written)."""
    got = {}
    monkeypatch.setattr(anatomy, "save", lambda fig, path, tight=True: got.update(fig=fig, tight=tight))
    anatomy.score_triptychs(panels, 10, 16, zoom, title, "unused.png")
    fig = got["fig"]
    fig.draw_without_rendering()
    return fig, got["tight"]


@pytest.mark.parametrize("n,scale,zoom", [(40, 1.0, False), (40, 1.0, True), (200, 1234.5, False),
                                          (60, 0.0037, True)])
def test_triptych_texts_stay_inside_the_figure_and_off_the_next_panel(monkeypatch, n, scale, zoom):
    title = "P12 a-model-with-a-long-name, some-corpus document 1234 (4096 tokens); first 4 of 9 heads, " \
            "all in the table: scores and pattern, full"
    fig, tight = _drawn(monkeypatch, _panels(n, scale), zoom, title)
    renderer = fig.canvas.get_renderer()
    assert not tight
    inside = fig.bbox.padded(0.5)  # half a pixel
    box = fig.get_tightbbox(renderer).transformed(fig.dpi_scale_trans)
    assert inside.x0 <= box.x0 and box.x1 <= inside.x1 and inside.y0 <= box.y0 and box.y1 <= inside.y1, box
    assert "\n" in fig._suptitle.get_text()  # too long for one line at 8 pt: wrapped
    panels = [ax for ax in fig.axes if getattr(ax, "_colorbar", None) is None]
    bars = [ax for ax in fig.axes if getattr(ax, "_colorbar", None) is not None]
    assert len(panels) == len(bars) == 8
    for r in range(2):
        row, row_bars = panels[4 * r: 4 * r + 4], bars[4 * r: 4 * r + 4]
        assert [ax.get_ylabel() for ax in row] == ["query position q", "", "", ""]
        assert len({tuple(ax.get_ylim()) for ax in row}) == 1  # one query axis per row
        for c in range(3):  # a colour bar's ticks and label end before the next panel begins
            right = row_bars[c].get_tightbbox(renderer).x1
            assert right < row[c + 1].get_tightbbox(renderer).x0, (r, c)
        title_box = fig._suptitle.get_window_extent(renderer)
        assert all(title_box.y0 > ax.title.get_window_extent(renderer).y1 for ax in row)
    plt.close(fig)


def test_triptych_is_saved_at_its_own_size_with_the_check_passing(tmp_path):
    path = tmp_path / "full.png"
    anatomy.score_triptychs(_panels(40, 1.0), 10, 16, False, "P12 demo: scores and pattern, full", path)
    check = read_check(path)
    with Image.open(path) as im:
        width = im.size[0]
    assert not check["problems"] and width == round(8.0 * DPI) == check["width_px"]
