"""Tolerances of the numerical tests, each following from the arithmetic it checks.

A numerical comparison in the tests is one of four kinds, and names its tolerance from here
(or, for a looser bound with a reason of its own, says that reason where it is set):

**Bitwise** (``assert_array_equal``, ``torch.equal``, ``==``): one code path compared with
itself on one machine: a resumed or kill -9-recovered run, a sweep point against its family
job, the rows a hook leaves alone in the same pass.  Same shapes, same kernels, same thread
count: deterministic, so no tolerance.

**float64 arithmetic** (:data:`FLOAT64_REL`, :data:`FLOAT64_ABS`): quantities computed in
float64 (numpy, or torch after ``.double()``) two ways from the same inputs, or against a
closed form.  float64's machine epsilon is 2**-52 ≈ 2.2e-16; a sum or dot product of n terms
is off by at most about n·eps of the sum of the magnitudes (Higham's γ_n), and an exp or log
adds an ulp or two.  The tests' reductions hold at most ~10³ terms: ≤ ~2e-13 relative.
1e-12 leaves a factor ~4 and is still 10⁵ times tighter than any float32 arithmetic can meet,
so a float32 step slipping into a float64 path fails.  Values of order one take it as
``abs`` too.  (Literal tolerances tighter than 1e-7 in the tests are float64 paths of this
kind, or a bound on a planted quantity itself, such as exp(−30), not on rounding.)

**float32 forward passes** (:data:`FLOAT32_FORWARD_ABS`, :data:`FLOAT32_FORWARD_REL`): a
value that went through a model's float32 forward pass (torch on the CPU: MKL's matrix
products, ATen's vectorised softmax, LayerNorm, exp) compared with another pass (another
sequence length, batch, engine, a row read alone) or with float64.  float32's machine epsilon
is 2**-23 ≈ 1.19e-7 (:data:`FLOAT32_EPS`), and *which* rounding errors a pass makes depends on
its kernels: the BLAS chooses blocking, vector width, FMA and the split over threads by the
matrices' shapes, the thread count and the CPU (AVX2 or AVX-512, Intel or AMD), and ATen
chooses vectorised or scalar kernels by ``ATEN_CPU_CAPABILITY``.  Two such passes agree to
float32 rounding, never bitwise, and a tolerance must hold for every kernel: rel=1e-9 on a
probability held on an AMD EPYC and failed on an Intel AVX-512 Xeon, where the two passes
differed by 6e-8 relative (issue #49).

* :data:`FLOAT32_FORWARD_ABS` = 1e-6 (~8 eps), for quantities of order one: attention
  weights and masses in [0, 1], correlations, ETCs of exact heads.  A float32 softmax weight
  ``p = exp(s − max) / Σ`` is off by about ``p(1 − p)·|δs|`` plus a few eps from the exp and
  the division, with ``δs`` a few ulps of the scores (|s| ≲ 5 where ``p(1 − p)`` is not tiny;
  the exact heads' 30 gives weights of exactly 0 or 1): ~1e-7 - 5e-7.
* :data:`FLOAT32_FORWARD_REL` = 1e-5 (~84 eps), for probabilities read from logits and for
  sums of float32 forward values.  ``p_t = exp(l_t − logsumexp l)``, so ``δp/p = δl_t −
  δlogsumexp``: up to twice the logits' absolute error, which is a few (4) ulps of the
  largest logit: 8 eps · max|l|, ≈ 1e-5 at |l| = 10.  (Seen: up to 3 ulps per log-probability,
  so a continuation of two tokens fits too.)  Models whose logits go beyond 10 (the planted
  attention-only model's reach 40) take :func:`float32_logit_tol` of their logits.

These are bounds for the small test models (d_model ≤ 64, ≤ 4 layers), not for a 1024-wide
GPT-2: a longer dot product accumulates more.  Tests using them are marked
``@pytest.mark.float32``, and ``make test`` runs that set a second time with other kernels
(Makefile ``FLOAT32_KERNELS``: ``ATEN_CPU_CAPABILITY=default``, ATen's scalar kernels instead
of AVX-512/AVX2; ``OMP_NUM_THREADS=1``, MKL's single-thread split; ``MKL_ENABLE_INSTRUCTIONS=
AVX2``, no AVX-512 matrix kernels on a CPU that has them), so a tolerance that holds for one
kernel only fails in CI rather than on a user's machine (tests/test_tolerances.py checks that
every test using these is marked, and that torch took the kernels asked for).

**float32 storage** (:data:`FLOAT32_STORAGE_REL`): a float64 value written as float32 (an
HDF5 artefact, float32 weights) and compared with the float64 value.  One rounding to nearest:
at most eps/2 relative, whatever the CPU; :data:`FLOAT32_EPS` allows it with a factor 2.  For
values of at most one in magnitude it serves as ``atol`` too.
"""

from __future__ import annotations

import numpy as np

FLOAT32_EPS = float(np.finfo(np.float32).eps)  # 2**-23 ≈ 1.19e-7
FLOAT64_EPS = float(np.finfo(np.float64).eps)  # 2**-52 ≈ 2.22e-16

#: float64 arithmetic over ≤ ~10³ terms (≤ ~2e-13), relative, and absolute for values of order one
FLOAT64_REL = 1e-12
FLOAT64_ABS = 1e-12

#: a float32 forward pass, absolute, for values of order one (attention weights, masses): ~8 eps
FLOAT32_FORWARD_ABS = 1e-6
#: a float32 forward pass, relative: probabilities from logits |l| ≲ 10, sums of forward values: ~84 eps
FLOAT32_FORWARD_REL = 1e-5

#: a float64 value stored as float32 and read back: one rounding, ≤ eps/2 relative
FLOAT32_STORAGE_REL = FLOAT32_EPS


def float32_logit_tol(logits) -> float:
    """Tolerance for what a float32 forward pass makes of ``logits`` (of the unembedding, or
    attention scores, the logits of the attention softmax): absolute on a logit or a
    log-probability, relative on a probability.  8 eps of the largest |logit| (4 ulps of a
    logit and 4 of the log-sum-exp, as :data:`FLOAT32_FORWARD_REL`), at least
    :data:`FLOAT32_FORWARD_REL`."""
    return max(FLOAT32_FORWARD_REL, 8 * FLOAT32_EPS * float(np.abs(np.asarray(logits, dtype=np.float64)).max()))
