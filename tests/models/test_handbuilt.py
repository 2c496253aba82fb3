import numpy as np
import pytest
import torch

from posmech.models import handbuilt as hb
from posmech.models.loading import load_bridge

from tests.tolerances import FLOAT32_FORWARD_ABS


@pytest.mark.float32
def test_positional_model_has_exact_patterns(prev_token_model_dir):
    bridge = load_bridge({"hf_dir": str(prev_token_model_dir), "name": "prevtok"}, device="cpu")
    x = torch.full((1, 12), 5, dtype=torch.long)
    with torch.inference_mode():
        _, cache = bridge.run_with_cache(x)
    prev = cache["blocks.0.attn.hook_pattern"][0, 1].numpy()
    np.testing.assert_allclose(prev.diagonal(-1), 1.0, atol=FLOAT32_FORWARD_ABS)
    uniform = cache["blocks.0.attn.hook_pattern"][0, 0].numpy()
    np.testing.assert_allclose(uniform[7, :8], 1 / 8, atol=FLOAT32_FORWARD_ABS)
    kernel = cache["blocks.1.attn.hook_pattern"][0, 0].numpy()[9, :10]
    expected = np.exp(-0.5 * (9 - np.arange(10)))
    np.testing.assert_allclose(kernel, expected / expected.sum(), atol=1e-5)


def test_head_for_scores_rejects_excess_rank():
    import pytest

    with pytest.raises(ValueError, match="rank"):
        hb.head_for_scores(np.eye(8), d_model=16, d_head=4)
