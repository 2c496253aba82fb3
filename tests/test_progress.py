"""Progress lines of long loops: done/total, rate, time left, at a bounded interval."""

from __future__ import annotations

import logging

from posmech.core.progress import Progress, logged


def test_progress_logs_first_every_interval_and_last(caplog):
    now = [0.0]
    caplog.set_level(logging.INFO, logger="posmech")
    p = Progress(100, "documents", every_s=30, clock=lambda: now[0])
    for i in range(1, 101):
        now[0] += 1.0  # one document per second
        p.update(i)
    lines = [r.getMessage() for r in caplog.records]
    # first update, then every 30 s (at 31, 61, 91), and the last
    assert len(lines) == 5
    assert lines[0] == "documents 1/100 (1 %), 1/s, ~99 s left"
    assert lines[-1] == "documents 100/100 (100 %), 1/s"


def test_logged_passes_items_through_and_knows_the_total(caplog):
    caplog.set_level(logging.INFO, logger="posmech")
    items = list(logged(["a", "b", "c"], what="chapters", every_s=3600))
    assert items == ["a", "b", "c"]
    msgs = [r.getMessage() for r in caplog.records]
    assert msgs[0].startswith("chapters 1/3") and msgs[-1].startswith("chapters 3/3 (100 %)")
    caplog.clear()
    assert list(logged(iter(range(2)), every_s=3600)) == [0, 1]  # no length: counts without a total
    assert caplog.records[-1].getMessage() == "documents 2"  # no rate: under a second


def test_progress_goes_to_the_log_file_not_the_terminal(tmp_path, capsys):
    from posmech.pipeline.runner import LOG, setup_logging

    log_file = tmp_path / "rule.log"
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        setup_logging(str(log_file))
        LOG.info("rule message")
        Progress(2, "documents", every_s=0).update(2)
        for h in root.handlers:
            h.flush()
        text = log_file.read_text()
        assert "rule message" in text and "documents 2/2 (100 %)" in text
        err = capsys.readouterr().err
        assert "rule message" in err and "documents 2/2" not in err
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
            h.close()
        for h in saved[0]:
            root.addHandler(h)
        root.setLevel(saved[1])
