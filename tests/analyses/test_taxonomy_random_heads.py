"""Random-init models hold no head role; a head planted among random weights still does (issue 43).

Random-init models of six architectures, initialised as their families do (what a random-init
twin is: ``posmech.models.handbuilt.RandomSpec``), through the taxonomy's own pass: no head is a
previous-token head over the uniform baseline (the post's loose definition counts several), the
sharp head the interventions read is the fallback's, and the head-roles table gives no head a
role. An exact previous-token head planted among random weights is found, and is the sharp head.
"""

from __future__ import annotations

import numpy as np
import pytest

from posmech.analyses import kernels as kn
from posmech.analyses.taxonomy import SHARP_FALLBACK_RULE, accumulate_diagonals, analyse_taxonomy
from posmech.models import handbuilt as hb
from posmech.models.loading import load_model
from posmech.models.scores import read_position_biases
from posmech.verdicts.heads import head_table
from posmech.verdicts.selfcheck import planted_random_spec

N_DOCS = 4


def _documents(seed: int = 0, n: int = 32) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [np.concatenate([[0], rng.integers(1, 96, size=n - 1)]) for _ in range(N_DOCS)]


def _taxonomy(path, name):
    model = load_model({"hf_dir": str(path), "name": name}, "cpu", "float32", "raw", "auto")
    stats = accumulate_diagonals(model, _documents(), batch_size=N_DOCS)
    windows, slopes = read_position_biases(path, *stats.sums.shape[:2])
    return analyse_taxonomy(stats, name, windows=windows, slopes=slopes)


@pytest.fixture(scope="module")
def random_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("random-archs")
    return {arch: hb.save_random_dir(hb.RandomSpec(arch, seed=0), root / arch) for arch in hb.RANDOM_ARCHS}


@pytest.mark.parametrize("arch", hb.RANDOM_ARCHS)
def test_a_random_init_model_has_no_previous_token_head_and_no_role(random_dirs, arch):
    per_head, _, chosen, meta = _taxonomy(random_dirs[arch], arch)
    # within a hair of the baseline (uniform causal; GPT-Neo's local layer its window's; BLOOM its
    # ALiBi bias alone): far below the 0.1 margin
    assert per_head["prev_token_excess"].abs().max() < 0.01
    assert not per_head["is_previous_token"].any() and meta["n_previous_token_heads"] == 0
    assert chosen["rule"].tolist() == [SHARP_FALLBACK_RULE]
    roles = head_table(arch, taxonomy=per_head, chosen=chosen)
    assert not roles["previous_token"].any() and (roles["p7_chosen"] == "none").all()
    if arch == "gpt_neo":
        assert meta["attention_windows"] == [0, 8]
    if arch == "bloom":
        assert meta["alibi_slopes"][0] == 0.25


def test_the_posts_loose_definition_counts_random_heads(random_dirs):
    """What the baseline corrects: on random weights the post's definition finds previous-token
    heads (a nearly uniform head peaks at offset -1 about half the time)."""
    loose = sum(int(_taxonomy(random_dirs[a], a)[0]["is_previous_token_post"].sum()) for a in ("gpt2", "llama"))
    assert loose >= 2


def test_a_previous_token_head_planted_among_random_weights_is_found(tmp_path):
    path = hb.save_model_dir(planted_random_spec(), tmp_path / "planted")
    per_head, _, chosen, _ = _taxonomy(path, "planted")
    prev = per_head.set_index("head_name")
    assert prev["is_previous_token"].tolist() == [False, False, True, False]
    assert prev.loc["L1H0", "prev_token_excess"] > 0.85 and prev.loc["L1H0", "ratio"] < 1e-6
    assert chosen["head_name"].tolist() == ["L1H0"] and chosen["rule"].iloc[0] != SHARP_FALLBACK_RULE
    roles = head_table("planted", taxonomy=per_head, chosen=chosen).set_index("head_name")
    assert roles["p7_chosen"].tolist() == ["none", "none", "sharp", "none"]


def test_zero_score_kernel_is_the_alibi_bias_alone_and_uniform_without_it():
    """The zero-score ETC fraction (the kernel role's baseline) is the ETC of the closed-form
    kernel of an ALiBi head with zero weights, over the same keys; 1 without a slope."""
    pos, k0 = np.array([31]), 2
    for slope in (0.0, 0.25, 1 / 16):
        etc = kn.effective_token_count(kn.alibi_kernel(pos, slope, k0))[0]
        n_keys = 31 - k0 + 1
        assert kn.zero_score_etc_fraction(slope, n_keys) == pytest.approx(etc / n_keys, rel=1e-12)
    assert kn.zero_score_etc_fraction(0.0, 30) == 1.0
    assert kn.classify(np.array([kn.zero_score_etc_fraction(0.25, 30)]), 0.1, 0.5)[0] == "slow_decay"
