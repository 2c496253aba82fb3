"""The shared pass of the diagonal taxonomy (P6/P7) and the score taxa (P13): one forward
pass per document both need, numbers equal to the two separate passes, and the file that
carries them to the light rules."""

from __future__ import annotations

import numpy as np
import pytest

from posmech.core import perf
from posmech.analyses.taxonomy import statistics as st
from posmech.analyses import anatomy as sa
from posmech.analyses import taxonomy as tx
from posmech.core.errors import PosmechError
from posmech.models import handbuilt as hb
from posmech.models.loading import load_bridge
from posmech.settings import defaults

from tests.tolerances import FLOAT32_FORWARD_ABS, FLOAT32_FORWARD_REL, float32_logit_tol

N, W = 40, 5
HEADS = {(0, 0): 1.0 * (np.arange(N)[None, :] - np.arange(N)[:, None]) - 3.0 * np.eye(N),
         (0, 1): 4.0 * ((np.arange(N)[None, :] - np.arange(N)[:, None]) == -1)}


@pytest.fixture(scope="module")
def bridge(tmp_path_factory):
    spec = hb.positional_spec(n_ctx=N, n_layer=1, n_head=4, scores=HEADS)
    path = hb.save_model_dir(spec, tmp_path_factory.mktemp("stats") / "m")
    return load_bridge({"name": "stats", "hf_dir": str(path)}, device="cpu")


def _docs(k: int, seed: int = 0, n: int = N) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [np.concatenate([[0], rng.integers(1, 40, n - 1)]) for _ in range(k)]


def _passes() -> int:
    return sum(perf.forwards().values())


def _same_stats(a: tx.DiagonalStats, b: tx.DiagonalStats) -> None:
    """Sums of attention weights from passes of other batch shapes: float32 rounding,
    relative, and absolute for the sums of vanishing weights (L0H0's far keys, ~exp(-38))."""
    np.testing.assert_allclose(a.sums, b.sums, rtol=FLOAT32_FORWARD_REL, atol=FLOAT32_FORWARD_ABS)
    np.testing.assert_array_equal(a.counts, b.counts)
    np.testing.assert_allclose(a.detector_sum, b.detector_sum, rtol=FLOAT32_FORWARD_REL)
    assert (a.n_documents, a.n_tokens) == (b.n_documents, b.n_tokens)


def _same_profiles(a: sa.ScoreProfiles, b: sa.ScoreProfiles) -> None:
    # score windows (logits of the attention softmax) of other passes: float32 rounding
    np.testing.assert_allclose(a.windows, b.windows, rtol=0, atol=float32_logit_tol(b.windows))
    np.testing.assert_array_equal(a.documents, b.documents)
    np.testing.assert_array_equal(a.queries, b.queries)
    assert (a.n_documents, a.n_tokens, a.window) == (b.n_documents, b.n_tokens, b.window)


OPTS = st.ProfileOptions.of(defaults("anatomy", window=W, rows_per_document=7, first_query=None, batch_size=1))


@pytest.mark.float32
def test_shared_documents_run_once_and_equal_the_separate_passes(bridge):
    docs_t, docs_a = _docs(4), _docs(3)  # the anatomy documents are the first 3 of the taxonomy's
    perf.reset()
    stats, prof, shared = st.attention_statistics(bridge, docs_t, 2, True, docs_a, OPTS)
    assert shared == 3
    assert _passes() == 4  # not 4 + 3
    _same_stats(stats, tx.accumulate_diagonals(bridge, docs_t, batch_size=1))
    _same_profiles(prof, sa.score_profiles(bridge, docs_a, W, 7))
    assert prof.max_check_error < 1e-3  # the first batch still checks the windows against hook_attn_scores
    # the planted taxa come out of the shared pass as out of a separate one
    taxa = sa.classify_taxa(prof.features, defaults("anatomy").taxa).set_index("head_name")["taxon"]
    assert (taxa["L0H0"], taxa["L0H1"]) == ("dark diagonal", "bright sub-diagonal")


@pytest.mark.float32
def test_anatomy_documents_beyond_the_taxonomy_run_with_the_profile_hooks_only(bridge):
    docs_t, docs_a = _docs(2), _docs(3)
    perf.reset()
    stats, prof, shared = st.attention_statistics(bridge, docs_t, 1, True, docs_a, OPTS)
    assert (shared, _passes(), stats.n_documents, prof.n_documents) == (2, 3, 2, 3)
    _same_profiles(prof, sa.score_profiles(bridge, docs_a, W, 7))


@pytest.mark.float32
def test_different_documents_share_nothing(bridge):
    docs_t, docs_a = _docs(2, seed=0), _docs(2, seed=1)
    perf.reset()
    stats, prof, shared = st.attention_statistics(bridge, docs_t, 1, False, docs_a, OPTS)
    assert (shared, _passes()) == (0, 4)
    _same_stats(stats, tx.accumulate_diagonals(bridge, docs_t, exclude_first_query=False))
    _same_profiles(prof, sa.score_profiles(bridge, docs_a, W, 7))


def test_without_anatomy_documents_only_the_diagonals_are_computed(bridge):
    perf.reset()
    stats, prof, shared = st.attention_statistics(bridge, _docs(2), 1, True)
    assert prof is None and shared == 0 and _passes() == 2


@pytest.mark.float32
def test_the_file_carries_both_to_the_light_rules(bridge, tmp_path):
    docs = _docs(3)
    stats, prof, shared = st.attention_statistics(bridge, docs, 1, True, docs, OPTS)
    path = tmp_path / "attention_statistics.h5"
    st.write_statistics(path, stats, prof, {"model": "stats", "taxonomy_context": N, "n_shared_documents": shared})
    s2, p2, attrs = st.read_statistics(path, need_profiles=True)
    np.testing.assert_array_equal(s2.sums, stats.sums)
    np.testing.assert_array_equal(s2.counts, stats.counts)
    np.testing.assert_array_equal(p2.windows, prof.windows)
    np.testing.assert_array_equal(p2.features, prof.features)
    assert p2.max_check_error == prof.max_check_error and attrs["n_shared_documents"] == 3
    assert type(attrs["taxonomy_context"]) is int  # plain numbers: they go into JSON table metadata
    # the taxonomy from the file equals the one-call analysis
    a = tx.analyse_taxonomy(s2, "stats")[0]
    b = tx.run_taxonomy(bridge, docs, "stats")[0]
    assert a["is_previous_token"].tolist() == b["is_previous_token"].tolist()
    np.testing.assert_allclose(a["ratio"].to_numpy(float), b["ratio"].to_numpy(float), rtol=FLOAT32_FORWARD_REL)
    # a file without profiles, asked for them, names the config key to change
    st.write_statistics(tmp_path / "no_prof.h5", stats, None, {})
    with pytest.raises(PosmechError, match="anatomy.models"):
        st.read_statistics(tmp_path / "no_prof.h5", need_profiles=True)
