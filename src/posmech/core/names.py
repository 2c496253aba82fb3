"""One name per quantity: what the report, the tables and the docs call the per-head
attention measures that look alike (issue 46, item 3).

Three measures are "mean attention from query n to key n − 1", on different text, and give
different numbers for the same head (``demo``'s L1H0 in one run of ``make demo``: 0.919
held-out, 0.932 on the analysis documents); each has one name, used wherever it appears:

* :data:`PREV_TOKEN_MASS` — ``prev_token_mass`` of ``heads.csv`` and ``taxonomy.csv`` (P6/P7,
  the head roles, the training dynamics' ``largest_prev_token_mass``, the largest of it):
  over queries n ≥ 1 of the analysis documents (``taxonomy.n_documents`` of the run's corpus,
  at the model's context);
* :data:`HELDOUT_PREV_SCORE` — ``previous_token_scores`` of a trained model's
  ``training/summary.json`` (the report's demo-model paragraph): over queries n ≥ 1 of windows
  of held-out text (``[BOS]`` + n_ctx − 1 characters), measured when training ends;
* :data:`RANDOM_PREV_MASS` — ``l_previous_mass`` of ``heads.csv`` (L1, ``previous_candidate_score``):
  over queries of random-token sequences.

The same for n − 2: :data:`HELDOUT_LOOK_BACK_TWO` (the summary's ``look_back_two_scores``: no
threshold, the best head is shown whatever it scores) and :data:`RANDOM_OFFSET2_MASS`
(``l_offset2_mass``, L5: the look-back-two role needs ``attn_only.role_min_score.look_back_two``;
a best candidate under it is shown with the words :data:`BELOW_THRESHOLD`).
"""

from __future__ import annotations

PREV_TOKEN_MASS = "previous-token mass"
HELDOUT_PREV_SCORE = "held-out previous-token score"
RANDOM_PREV_MASS = "previous-token mass on random tokens"
HELDOUT_LOOK_BACK_TWO = "held-out look-back-two score"
RANDOM_OFFSET2_MASS = "offset −2 mass on random tokens"
BELOW_THRESHOLD = "below threshold"

#: each name, the column or key it names, and what it is in words
WORDS: dict[str, tuple[str, str]] = {
    PREV_TOKEN_MASS: ("prev_token_mass", "mean attention from query n to key n − 1 over queries n ≥ 1 of the "
                      "analysis documents"),
    HELDOUT_PREV_SCORE: ("previous_token_scores", "mean attention from query n to key n − 1 over queries n ≥ 1 of "
                         "windows of held-out text, measured when training ends"),
    RANDOM_PREV_MASS: ("l_previous_mass", "mean attention from query n to key n − 1 on random-token sequences"),
    HELDOUT_LOOK_BACK_TWO: ("look_back_two_scores", "mean attention from query n to key n − 2 over queries n ≥ 2 of "
                            "windows of held-out text"),
    RANDOM_OFFSET2_MASS: ("l_offset2_mass", "mean attention from query n to key n − 2 on random-token sequences"),
}


def described(name: str) -> str:
    """``name (what it is)``, e.g. for a hover or a caption."""
    return f"{name} ({WORDS[name][1]})"
