"""A synthetic dynamics table (the rule dynamics' columns) with known values: two models
(demo, demo-attn) x five checkpoints (steps 0, 50, 200, 500 and the final model at 2000)."""

from __future__ import annotations

import math

import pandas as pd

STEPS = [0, 50, 200, 500, 2000]
REVISIONS = ["step0", "step50", "step200", "step500", "final"]
#: the largest previous-token mass per model and checkpoint (rises: the head forms)
SCORES = {"demo": [0.08, 0.12, 0.55, 0.88, 0.93], "demo-attn": [0.07, 0.31, 0.74, 0.9, 0.91]}
KERNELS = {"demo": ["uniform", "uniform", "slow_decay", "local", "local"],
           "demo-attn": ["uniform", "slow_decay", "local", "local", "local"]}
P7_MIN = 0.5  # the synthetic finding: the score holds from this value up


def synthetic_dynamics() -> pd.DataFrame:
    rows = []
    for model in ("demo", "demo-attn"):
        for i, (rev, step) in enumerate(zip(REVISIONS, STEPS)):
            point = model if rev == "final" else f"{model}@{rev}"
            score = SCORES[model][i]
            verdict = "holds" if score >= P7_MIN else "fails"
            base = {"model": model, "revision": rev, "step": step, "checkpoint": point}
            rows += [
                {**base, "claim": "P7", "quantity": "largest_prev_token_mass", "value": score,
                 "label": f"L1H{i % 2}", "verdict": verdict, "reason": f"score {score} vs {P7_MIN}"},
                {**base, "claim": "P7", "quantity": "largest_prev_token_mass_layer", "value": float(i > 1),
                 "label": f"L{int(i > 1)}H{i % 2}", "verdict": verdict, "reason": ""},
                {**base, "claim": "K3", "quantity": "previous_token_head_etc", "value": 30.0 / (1 + (6 if model == "demo" else 9) * i),
                 "label": "", "verdict": "holds", "reason": ""},
                {**base, "claim": "K3", "quantity": "previous_token_head_kernel_type", "value": math.nan,
                 "label": KERNELS[model][i], "verdict": "holds", "reason": ""},
                # P5: not measurable on demo-attn (its sharp head in layer 0) and at demo's first two points
                {**base, "claim": "P5", "quantity": "prev_token_mass_ratio_knocked",
                 "value": math.nan if model == "demo-attn" or i < 2 else [0, 0, 0.7, 0.4, 0.3][i], "label": "",
                 "verdict": "not measurable" if model == "demo-attn" or i < 2 else ("holds" if i > 2 else "fails"),
                 "reason": "the sharpest previous-token head is in layer 0" if model == "demo-attn" or i < 2 else ""},
            ]
    return pd.DataFrame(rows)
