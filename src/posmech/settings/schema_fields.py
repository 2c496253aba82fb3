"""Generated from workflow/schemas/config.schema.yaml by ``make config-doc``
(``python -m posmech.settings.reference --write``): do not edit, change the schema and
regenerate (``tests/test_settings.py`` fails while this file differs from what the schema gives).

One frozen dataclass per config section with a settings class (:data:`posmech.settings.MODULES`):
``<Section>Fields``, one typed field per key of the section, in the schema's order, with no
defaults (the schema's apply); the section's settings class (``posmech.settings.<family>``)
inherits it and adds only what the schema cannot say. A nested object (``anatomy.taxa``) is a
whole settings class here, ``<Section><Key>Settings``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from posmech.settings import Settings


@dataclass(frozen=True)
class CacheFields(Settings):
    """The fields of config section ``cache`` (its settings class:
    ``posmech.settings.cache.CacheSettings``)."""

    section: ClassVar[str] = "cache"

    #: Models cached by the default target; empty: every model.
    models: tuple[str, ...]
    #: Corpora cached for each of those models; empty: all corpora.
    corpora: tuple[str, ...]
    #: Which activations are cached: `resid_pre`, the residual stream before every block plus the
    #: final residual before ln_final (n_layers + 1 entries); `ln1_out`, the post-ln1 input to
    #: attention (n_layers entries).
    hooks: tuple[str, ...]
    #: Cache the first N documents of the tokenized corpus; null: all.
    n_documents: int | None
    #: Documents per forward pass (right-padded to the longest; padding never reaches the cache or
    #: the means).
    batch_size: int
    #: Dtype of the per-token arrays (the position-wise means are always float64).
    storage_dtype: str
    #: HDF5 compression of the per-token arrays, applied by one streaming copy once the pass is
    #: complete (the resumable in-progress file is uncompressed).
    compression: str | None
    #: gzip level (with `compression: gzip`).
    compression_level: int
    #: HDF5 chunk length along the token axis (chunks are one layer × `chunk_tokens` × d_model).
    chunk_tokens: int
    #: Batches between resume checkpoints (the float64 running sums and the documents done); a
    #: killed run resumes after the last one.
    checkpoint_every: int
    #: …and at most one checkpoint per this many seconds (0: every `checkpoint_every` batches);
    #: bounds the cost of writing the float64 sums on a GPU.
    checkpoint_seconds: float
    #: What runs the cache's forward pass: `posmech` the posmech forward engine (GPT-2, GPT-Neo,
    #: legacy TransformerLens checkpoints; the processing mode's weight transformations applied once
    #: to the weights, fused attention and GELU, no bridge overhead), so the cached values are
    #: tensors its forward pass makes anyway; equal to the bridge's hooks to float32 rounding
    #: (tested); `bridge` TransformerLens hooks (any architecture); `auto`: `posmech` where it runs
    #: the model, else `bridge`; `hf`: the former name of `posmech`.
    engine: str


@dataclass(frozen=True)
class TaxonomyFields(Settings):
    """The fields of config section ``taxonomy`` (its settings class:
    ``posmech.settings.taxonomy.TaxonomySettings``)."""

    section: ClassVar[str] = "taxonomy"

    #: Models analysed; empty: every model.
    models: tuple[str, ...]
    #: Corpus of the documents (the post: web text); null: the first corpus under `corpora`
    #: (`webtext` in the study, `bible` offline).
    corpus: str | None
    #: Documents averaged over: the first ones (corpus order) with at least `context` tokens, cut to
    #: `context`; fewer are used (warning in the log, count in the table metadata) when fewer exist.
    n_documents: int
    #: Tokens per document; null: the model's full context (the tokens file's `n_ctx`).
    context: int | None
    #: Documents per forward pass.
    batch_size: int
    #: Leave query position 0 (it can only attend to itself) out of the diagonal means; its weight
    #: on offset 0 is 1/context. The `head_detector_score` column never excludes it (as
    #: TransformerLens).
    exclude_first_query: bool
    #: Offsets whose mean diagonals agree within this relative tolerance are tied for the largest; a
    #: tie goes to the smallest offset, so an exactly uniform head (equal on offsets 0 and 1) is
    #: never a previous-token head. Means are accumulated in float64 (float32 patterns carry ~6e-8
    #: relative rounding per entry).
    tie_rtol: float
    #: A previous-token head (P6's finding, P7, the chosen sharp / early heads, the head roles) has
    #: its largest mean diagonal at offset -1 (the post's definition) and a mean attention there at
    #: least this much above what a uniform causal head gives on the same documents and positions
    #: (1/(i+1) from query i: 0.099 at context 32, 0.006 at 1024). A random-init head is close to
    #: uniform and, nearly flat, has its largest mean at offset -1 about half the time (offsets 0
    #: and 1 tie exactly under uniform attention); its excess is at most 0.0007 on random-init
    #: models of GPT-2, Llama, GPT-NeoX, BLOOM, OPT and GPT-Neo and on the demo's twin
    #: (docs/claims.md, "Head roles against random weights"), the trained demo's previous-token
    #: heads' 0.44 to 0.83: a tenth of the attention is far from both. The post's count (69 of 144
    #: on gpt2, any margin) is kept as the `_post` quantities, which the published-value comparison
    #: reads.
    prev_token_min_excess: float
    #: Early previous-token heads: ranked within the top `early_top_n` by the P7 ratio and in layers
    #: below the sharp head (the post's top 11 give its six early heads: L3H3, L2H2, L2H4, L1H0,
    #: L3H7, L3H2). The sharp head is rank 1.
    early_top_n: int
    #: Per model, heads replacing the automatic choice, e.g. `{gpt2: {sharp: L4H11, early: [L2H2,
    #: L3H3]}}` (either key may be given).
    pin: dict[str, Any]


@dataclass(frozen=True)
class AnatomyTaxaSettings(Settings):
    """The ``anatomy.taxa`` config section: P13 thresholds, in units of the row's spread (the
    standard deviation of its window)."""

    section: ClassVar[str] = "anatomy.taxa"

    #: A row *shows* a feature (dip, bump, trend) when its normalised value exceeds this; `frac_*`
    #: count those rows.
    row_min: float
    #: **Dark diagonal** when the median dip (the self score below the smooth profile, in row
    #: spreads) is at least this, shown by `fraction_min` of the rows, and the median trend is at
    #: least `trend_min`.
    dip_min: float
    #: **Bright sub-diagonal** when the median bump (the previous key's score above the smooth
    #: profile) is at least this, shown by `fraction_min` of the rows. A head meeting both goes to
    #: the feature exceeding its threshold by the larger factor; a head meeting neither is
    #: **neither**.
    bump_min: float
    #: Smallest fraction of the rows showing the dip (dark diagonal) or the bump (bright
    #: sub-diagonal).
    fraction_min: float
    #: Dark diagonal: smallest median trend (the smooth profile's rise over W keys at the diagonal,
    #: in row spreads: later keys score higher); null: no trend condition.
    trend_min: float | None


@dataclass(frozen=True)
class AnatomyFields(Settings):
    """The fields of config section ``anatomy`` (its settings class:
    ``posmech.settings.anatomy.AnatomySettings``)."""

    section: ClassVar[str] = "anatomy"

    #: Models analysed; empty: every model.
    models: tuple[str, ...]
    #: Corpus of the documents (the post: web text); null: the first corpus under `corpora`.
    corpus: str | None
    #: Tokens per document: only documents with at least this many tokens are used, cut to it (null:
    #: the model's full context, the tokens file's n_ctx).
    context: int | None
    #: P12: per model, the heads drawn instead of the taxonomy's chosen sharp and early heads, e.g.
    #: `{gpt2: [L2H2, L4H11]}`.
    heads: dict[str, tuple[str, ...]]
    #: P12: which document (0 = the first in corpus order with at least `context` tokens).
    document: int
    #: P12: first query and key position of the zoomed square (positions
    #: `zoom_start..zoom_start+zoom_size−1`); clipped so the zoom fits the document (warning in the
    #: log).
    zoom_start: int
    #: P12: side of the zoomed square (the post: 50 × 50); half the document when that is shorter,
    #: so the zoom never repeats the full figure.
    zoom_size: int
    #: P12: rows of the two figures, one head each: the sharp head, then the early heads best first,
    #: up to this many; the table (`anatomy/scores.csv`) and the HDF5 file keep every drawn head. A
    #: random-init model has a dozen "early" heads, and a row costs ~2 CPU s per figure.
    figure_heads: int
    #: P13: documents the taxa are measured on (the first ones with at least `context` tokens;
    #: fewer, with a warning, when fewer exist).
    n_documents: int
    #: P13: documents per forward pass.
    batch_size: int
    #: P13: W — a query `n`'s row window is its raw scores at keys `n−W..n+W` (future keys
    #: included); the smooth profile is a quadratic fitted to the `2W−1` offsets other than −1 and
    #: 0.
    window: int
    #: P13: query positions per document, evenly spaced over those with a whole window; null: all.
    #: The stored rows are `n_documents × rows_per_document × heads × (2W+1)` floats (gpt2: 40 MB).
    rows_per_document: int | None
    #: P13: first query position; null: `W + 1`, so no window contains position 0 (the BOS token,
    #: whose scores are special).
    first_query: int | None
    #: P13 thresholds, in units of the row's spread (the standard deviation of its window).
    taxa: AnatomyTaxaSettings


@dataclass(frozen=True)
class GeometryFields(Settings):
    """The fields of config section ``geometry`` (its settings class:
    ``posmech.settings.geometry.GeometrySettings``)."""

    section: ClassVar[str] = "geometry"

    #: Models analysed; empty: every model.
    models: tuple[str, ...]
    #: Tokens whose one-token-repeated prompts are averaged (drawn with `seed`, without replacement,
    #: from the vocabulary without the special tokens; capped at the vocabulary size).
    n_tokens: int
    #: Seed of the token draw.
    seed: int
    #: Prompts per forward pass (each is `n_ctx` long: memory ~ `batch_size × n_ctx × d_model ×
    #: (n_layers + 1)` floats per batch).
    batch_size: int
    #: `model`: the prompts start with BOS when the model's `prepend_bos` is true and the token
    #: fills positions 1..n_ctx−1 (the BOS row is excluded from centring and analyses); `never`: the
    #: token fills every position (the post's "1024 hello's").
    bos: str
    #: First position used by PCA, canonical angles and sparsity; null: the first repeated-token
    #: position (1 with BOS, 0 without). Raise it to drop GPT-2's attention-sink position 0 when
    #: `bos: never`.
    first_position: int | None
    #: Layer of the P10 three-panel (helix) figure and of the P11 scorecard angles (`n_layers` = the
    #: final residual; larger values are clipped).
    layer: int
    #: Principal components tabulated in `pca.csv`.
    n_components: int
    #: Dimension of the singular subspaces whose canonical angles are computed (P11).
    k: int
    #: P11: the top-`k` subspace of a matrix is defined only when singular values `k` and `k+1`
    #: differ: when the relative gap `1 − s[k+1]/s[k]` of W_pos or of a layer's extended embeddings
    #: is below this, that layer's angles are reported as **undefined** (NaN, `defined: false` and
    #: the reason in the table, an empty scorecard value with the reason, a warning in the log)
    #: instead of angles between two arbitrary bases.
    min_gap: float
    #: An entry is "far from 0" when its absolute value exceeds this many times the RMS entry of the
    #: centred `W_pos` (P9).
    sparsity_threshold: float


@dataclass(frozen=True)
class InterventionsPrevKnockoutSettings(Settings):
    """The ``interventions.prev_knockout`` config section: P5: knock out attention to the previous
    position."""

    section: ClassVar[str] = "interventions.prev_knockout"

    #: Query positions `q >= 1` with `q % period == phase` cannot attend to `q − 1` (the post: every
    #: 5th).
    period: int
    #: Offset of the knocked-out queries (`< period`).
    phase: int
    #: Layers whose heads (all of them) are knocked out; null: every layer before the sharp head's
    #: (`gpt2`: 0–3, the post's; none when the sharp head is in layer 0, and every condition then
    #: equals the intact run). Listing the sharp head's own layer knocks it out directly: its
    #: pattern is recorded as used, after the knock-out.
    layers: tuple[int, ...] | None


@dataclass(frozen=True)
class InterventionsExtendedAveragingSettings(Settings):
    """The ``interventions.extended_averaging`` config section: P15: average the extended
    positional embeddings just before each chosen head's layer."""

    section: ClassVar[str] = "interventions.extended_averaging"

    #: Contiguous positions whose extended positional embeddings are averaged (the post: 10); groups
    #: start after the BOS position, which is left alone.
    group_size: int


@dataclass(frozen=True)
class InterventionsRepeatedTokensSettings(Settings):
    """The ``interventions.repeated_tokens`` config section: P14: previous-token attention on
    repeated consecutive tokens."""

    section: ClassVar[str] = "interventions.repeated_tokens"

    #: The P14 zoom window starts this many positions before the first repeated token.
    context: int


@dataclass(frozen=True)
class InterventionsInductionInterventionSettings(Settings):
    """The ``interventions.induction_intervention`` config section: P16: redirect the sharp head
    and scale its output on a repeat prompt."""

    section: ClassVar[str] = "interventions.induction_intervention"

    #: P16 prompt file (repository-relative or absolute): prompt text, the repeated triple, the
    #: redirects of the sharp head's attention, the target variant sets; format in its header
    #: (resources/prompts/induction_ninja.yaml). `resources/prompts/induction_short.yaml` fits a
    #: 32-token context (CI); `induction_chars.yaml` also has every character of the target words
    #: once in the prompt, so that a character model can copy them (demo).
    prompt: str
    #: Factor on the sharp head's output (`hook_z`) in the scaled conditions (the post: 2, doubled).
    output_scale: float


@dataclass(frozen=True)
class InterventionsFields(Settings):
    """The fields of config section ``interventions`` (its settings class:
    ``posmech.settings.interventions.InterventionsSettings``)."""

    section: ClassVar[str] = "interventions"

    #: Models analysed; empty: every model.
    models: tuple[str, ...]
    #: Web-text corpus of P5, P14, P15 (the post: openwebtext-10k; offline: `bible`); null: the
    #: first corpus.
    corpus: str | None
    #: Documents measured: the first ones of the tokenized corpus with at least `min_tokens` tokens.
    n_documents: int
    #: Shorter documents are skipped. Left null, it scales with each model's context n_ctx: min(64,
    #: n_ctx) (gpt2, 1024 tokens: 64).
    min_tokens: int | None
    #: Cut documents to this many tokens (null: as tokenized, up to the model's context).
    max_tokens: int | None
    #: Side of the zoomed attention submatrix in the figures (the post: 50 × 50). Left null, it
    #: scales with each model's context n_ctx: min(50, n_ctx) (gpt2, 1024 tokens: 50).
    zoom: int | None
    #: First query/key position of the zoom window of P5 and P15 (the post: the upper-left corner;
    #: P14 zooms on the first repeat).
    zoom_start: int
    #: P5: knock out attention to the previous position.
    prev_knockout: InterventionsPrevKnockoutSettings
    #: P15: average the extended positional embeddings just before each chosen head's layer.
    extended_averaging: InterventionsExtendedAveragingSettings
    #: P14: previous-token attention on repeated consecutive tokens.
    repeated_tokens: InterventionsRepeatedTokensSettings
    #: P16: redirect the sharp head and scale its output on a repeat prompt.
    induction_intervention: InterventionsInductionInterventionSettings


@dataclass(frozen=True)
class KernelsFields(Settings):
    """The fields of config section ``kernels`` (its settings class:
    ``posmech.settings.kernels.KernelsSettings``)."""

    section: ClassVar[str] = "kernels"

    #: Models whose kernels are computed (rotary/ALiBi models are refused); empty: every model.
    models: tuple[str, ...]
    #: Corpus whose cached position-wise mean post-ln1 embeddings are the p_i (study: `webtext`, 500
    #: documents; the post: ~500 OpenWebText texts); null: the first corpus under `corpora`.
    means_corpus: str | None
    #: Corpus of the query texts x_n (study: `bible`, chapters as in the post); null: the first
    #: corpus.
    query_corpus: str | None
    #: Query texts drawn with `seed` among the query corpus's documents long enough for the largest
    #: query position; the stored kernel is their mean, the spread over them is K5.
    n_chapters: int
    #: Seed of the query-text draw.
    seed: int
    #: Keys 0..k0−1 are left out of the softmax (heads parking attention on BOS, as in the post).
    k0: int
    #: Kernels are computed for every query n in k0..this (the query × key heatmaps, K2). Left null,
    #: it scales with each model's context n_ctx: min(100, n_ctx − 1) (gpt2, 1024 tokens: 100).
    heatmap_max_position: int | None
    #: Further query positions n of the ETC table, each below the model's context. Left null, it
    #: scales with each model's context n_ctx: round(f · n_ctx), f = 100, 200, 400, 600, 800, 1000 /
    #: 1024, within k0 + 1 .. n_ctx − 1 (gpt2, 1024 tokens: `[100, 200, 400, 600, 800, 1000]`).
    etc_positions: tuple[int, ...] | None
    #: n of the K4 heatmap, of the kernel types and of the scorecard; must be in `etc_positions`.
    #: Left null, it scales with each model's context n_ctx: the largest of `etc_positions` (gpt2,
    #: 1024 tokens: 1000).
    etc_heatmap_position: int | None
    #: A kernel is `local` when ETC / (n − k0 + 1) is below this (K3; study: ETC < 20 at n = 1000).
    local_max_fraction: float
    #: A kernel is `uniform` when ETC / (n − k0 + 1) is at least this (K3); between the two:
    #: `slow_decay`.
    uniform_min_fraction: float
    #: Offsets n − i = 0..this compared across query rows to measure the translation equivariance of
    #: local kernels (K2).
    equivariance_max_offset: int
    #: Later heads drawn as query × key heatmaps (K2), as `L{layer}H{head}` (study: L2H1, L3H0,
    #: L4H11, L5H0, L5H1, L5H5); heads a model lacks are skipped, and with none left (or none given)
    #: one head per kernel type from layers ≥ 1 is drawn.
    selected_heads: tuple[str, ...]


@dataclass(frozen=True)
class ContextualFields(Settings):
    """The fields of config section ``contextual`` (its settings class:
    ``posmech.settings.contextual.ContextualSettings``)."""

    section: ClassVar[str] = "contextual"

    #: Models analysed; empty: every model.
    models: tuple[str, ...]
    #: Corpora whose long documents are the texts of K7–K9 (the study: `bible`, `webtext`; the post:
    #: the Bible and web text); empty: all corpora.
    corpora: tuple[str, ...]
    #: Corpus of the text whose patterns are drawn: the first text drawn from it is the one of K6
    #: and K10 (the study: a Bible chapter); null: the first of `corpora`.
    pattern_corpus: str | None
    #: Every token of it measures `blocks.0.ln1.hook_scale` (the study: `webtext`); null: the first
    #: corpus.
    scale_corpus: str | None
    #: The fixed destination token x_n of K6 and K8/K9; must be one token for the model's tokenizer
    #: (the demo: `" "`, its character-level "stopword").
    destination_token: str
    #: s of the linear LayerNorm; null: the median scale measured on `scale_corpus`.
    ln_scale: float | None
    #: Texts drawn with `seed` from each of `corpora` among documents of at least `max_position` + 1
    #: tokens.
    n_per_corpus: int
    #: Seed of the text draw and of the K9 redraws.
    seed: int
    #: Largest destination position n of the stored denominators (K8) and of K10's rows; null: n_ctx
    #: − 2 (gpt2: 1022, the post's K10 n).
    max_position: int | None
    #: K6 destination positions n (each ≤ `max_position`). Left null, it scales with each model's
    #: context n_ctx: round(f · n_ctx), f = 399, 699, 1022 / 1024, within k0 + 1 .. max_position
    #: (gpt2, 1024 tokens: `[399, 699, 1022]`).
    positions: tuple[int, ...] | None
    #: K6 draws the last `grid²` keys as a `grid × grid` image (the post: 20 × 20 = 400 keys; the
    #: demo: 5). Left null, it scales with each model's context n_ctx: min(20, ⌊√(max_position +
    #: 1)⌋) (gpt2, 1024 tokens: 20).
    grid: int | None
    #: Keys before k0 (BOS) are left out of ETC, local mass and the TV distances (renormalised over
    #: k0..n).
    k0: int
    #: n of K7's positional quantities; null: the largest of `positions`.
    classify_position: int | None
    #: K7 local mass: the positional-pattern mass on keys n − local_window + 1..n.
    local_window: int
    #: K7: `duplicate_token` when the content score adds at least this attention to earlier copies
    #: of the destination token (real mass on the copies minus the positional pattern's).
    duplicate_min_excess: float
    #: K7: else `detokenization` when the local mass is at least this.
    local_min_mass: float
    #: K7: else `contextual` when ETC / n_keys is below this; else `other`.
    uniform_min_fraction: float
    #: K8: a head's spread across texts is the mean over n ≥ this of the std over texts of log Z(n)
    #: (skips the first positions, where BOS dominates). Left null, it scales with each model's
    #: context n_ctx: round(100 / 1024 · n_ctx), within 1 .. max_position − 1 (gpt2, 1024 tokens:
    #: 100).
    denominator_from: int | None
    #: K8: how many contextual heads are reported as varying most across texts (the post: two, heads
    #: 6 and 8).
    n_most_varying: int
    #: K9: destination positions n of the variance model (each ≤ `max_position`). Left null, it
    #: scales with each model's context n_ctx: round(f · n_ctx), f = 100, 400, 1000 / 1024, within 2
    #: .. max_position (gpt2, 1024 tokens: `[100, 400, 1000]`).
    variance_positions: tuple[int, ...] | None
    #: K9: i.i.d. redraws of keys 1..n−1 from the text's own tokens (positions fixed), per text and
    #: n.
    n_resamples: int
    #: K10: a layer-1 head is mostly positional when TV(real row, positional kernel) is below this
    #: (K1's kernel; keys from `kernels.k0`, means from `kernels.means_corpus`).
    mostly_positional_max_tv: float


@dataclass(frozen=True)
class NeuronsFields(Settings):
    """The fields of config section ``neurons`` (its settings class:
    ``posmech.settings.neurons.NeuronsSettings``)."""

    section: ClassVar[str] = "neurons"

    #: Models analysed (each needs an MLP in layer 0); empty: every model with one.
    models: tuple[str, ...]
    #: Layer-0 heads of the bag of tokens, pinned (e.g. `[L0H0, L0H2]`); empty: the heads of
    #: `head_classes` (K7).
    heads: tuple[str, ...]
    #: K7 classes whose heads form the bag of tokens when `heads` is empty (the demo: `[contextual,
    #: other, detokenization]`: its layer-0 heads are all local, it has no contextual head).
    head_classes: tuple[str, ...]
    #: The calibration text among layer0.h5's texts (title or index); null: the typical text, whose
    #: median log Z (n ≥ `from_position`, mean over the heads) is the median across texts (the post:
    #: "a fixed control text with an average number of keywords").
    calibration_text: str | int | None
    #: Destination positions n ≥ this enter the calibration median Z̄, the neuron ranking and the C3
    #: fit metrics (the first positions are dominated by BOS; the demo: 8); below the model's
    #: context. Left null, it scales with each model's context n_ctx: round(100 / 1024 · n_ctx),
    #: within 1 .. n_ctx − 3 (gpt2, 1024 tokens: 100).
    from_position: int | None
    #: n* of the stored extended embeddings (content score and positional pattern at n*); null:
    #: `contextual.max_position`.
    reference_position: int | None
    #: C3: the norm in front of the neurons' MLP (LayerNorm 2, or an RMSNorm) of the approximate
    #: residual: `linear` at its measured scale (the post) or `exact`, the real norm.
    ln2: str
    #: s2 of the linear LayerNorm 2 (the norm in front of the neurons' MLP); null: the median of its
    #: hook_scale (`blocks.0.ln2.hook_scale` on GPT-2) over layer0.h5's texts (positions ≥ 1).
    ln2_scale: float | None
    #: Neurons of C2/C3, indices into the neurons' MLP (the study, gpt2: 300, 704, 1621, 1710);
    #: empty: the `n_auto` best ranked.
    neurons: tuple[int, ...]
    #: How many top-ranked neurons C2/C3 show when `neurons` is empty.
    n_auto: int
    #: C2: top and bottom tokens listed per neuron (the demo: 10).
    n_tokens: int
    #: C2: only tokens occurring at least this often in the contextual corpora are listed (keeps
    #: glitch tokens out).
    min_token_count: int


@dataclass(frozen=True)
class AttnOnlyInductionScoreSettings(Settings):
    """The ``attn_only.induction_score`` config section: How the induction head is found: `[BOS] R
    R`, R random tokens."""

    section: ClassVar[str] = "attn_only.induction_score"

    #: `[BOS] R R` sequences of the induction score.
    n_sequences: int
    #: Length of `R`; the score is the mean attention from every query of the second `R` to the key
    #: just after the query token's first occurrence.
    half_length: int


@dataclass(frozen=True)
class AttnOnlyBosInductionSettings(Settings):
    """The ``attn_only.bos_induction`` config section: L4: P([B]) at the final [A] of `[BOS] A B
    R1..Rk A` vs `A B R1..Rk A`."""

    section: ClassVar[str] = "attn_only.bos_induction"

    #: L4 samples: distinct A, B, R1..Rk per sample, the same draws with and without BOS.
    n_samples: int
    #: Random tokens R between B and the final A (the post: 7).
    n_random: int


@dataclass(frozen=True)
class AttnOnlyRoleMinScoreSettings(Settings):
    """The ``attn_only.role_min_score`` config section: Smallest score of a found role; a role
    whose best head scores below it is `none` (not filled: its L claims are not measurable,
    `head_roles.csv` names the best candidate), never the best of the rest."""

    section: ClassVar[str] = "attn_only.role_min_score"

    #: Mean attention at offset −1 (queries `first_query..`): uniform attention over BOS + 12 tokens
    #: gives ≈ 0.12, the post's L0H3 0.51.
    previous: float
    #: Mean attention at offset −2, as `previous` (the post's L0H0: 0.25).
    look_back_two: float
    #: Induction score: uniform attention over `[BOS] R R` gives ≈ 1 / (2 · half_length); a
    #: random-init GPT-2-shaped model's best head scores 0.03.
    induction: float


@dataclass(frozen=True)
class AttnOnlyFields(Settings):
    """The fields of config section ``attn_only`` (its settings class:
    ``posmech.settings.attn_only.AttnOnlySettings``)."""

    section: ClassVar[str] = "attn_only"

    #: Models analysed (the full study: `attn-only-2l`); empty: every model.
    models: tuple[str, ...]
    #: Seed of the random sequences (L1, L2, L3, L5 share theirs; the induction score uses `seed +
    #: 1`, L4 `seed + 2`).
    seed: int
    #: Random-token sequences averaged over in L1, L2, L3, L5 (the post: 500).
    n_sequences: int
    #: Random tokens after BOS (the post: 12, i.e. 13 × 13 heatmaps).
    n_tokens: int
    #: Query position of the score / pattern curves (the post: 8, BOS + 8 tokens).
    query: int
    #: Masses (previous = key q−1, offsets −2, −3, self, BOS) and the role-finding diagonals are
    #: averaged over queries `first_query..n_tokens` (≥ 3 so that keys q−1..q−3 are never BOS).
    first_query: int
    #: Start every sequence with the tokenizer's BOS token (`model`: the model's `prepend_bos`);
    #: `true` with a tokenizer that has no BOS token is an error naming this key; L4 compares with
    #: and without BOS, so a model run without BOS gets no `bos_induction` outputs.
    bos: str | bool
    #: Sequences per forward pass.
    batch_size: int
    #: How the induction head is found: `[BOS] R R`, R random tokens.
    induction_score: AttnOnlyInductionScoreSettings
    #: L4: P([B]) at the final [A] of `[BOS] A B R1..Rk A` vs `A B R1..Rk A`.
    bos_induction: AttnOnlyBosInductionSettings
    #: Smallest score of a found role; a role whose best head scores below it is `none` (not filled:
    #: its L claims are not measurable, `head_roles.csv` names the best candidate), never the best
    #: of the rest.
    role_min_score: AttnOnlyRoleMinScoreSettings
    #: Per model, heads replacing the automatic choice, e.g. `{attn-only-2l: {previous: L0H3,
    #: look_back_two: L0H0, induction: L1H6}}` (any of the keys); a head the model lacks is an error
    #: naming the key, before any forward pass.
    pin: dict[str, Any]


@dataclass(frozen=True)
class SinksFields(Settings):
    """The fields of config section ``sinks`` (its settings class:
    ``posmech.settings.sinks.SinksSettings``)."""

    section: ClassVar[str] = "sinks"

    #: Models analysed; empty: every model.
    models: tuple[str, ...]
    #: Corpus of the samples (Gu et al.: natural text); null: the first corpus under `corpora`.
    corpus: str | None
    #: Samples: the first documents (corpus order) with at least `n_tokens` tokens, cut to them
    #: (fewer, with a warning in the log, when fewer are long enough). 64 samples x every (layer,
    #: head): the sink ratio's resolution is finer than 1/64.
    n_samples: int
    #: T, the tokens per sample: Gu et al.'s 64 (eval_sink_open_source.py, token_length = 64); the
    #: model's context when it is shorter (the demo models: 32). At least 10: a uniform head's
    #: alpha[0] = H_T / T is below 0.3 from T = 10 on (0.31 at T = 9), so a random-init model has no
    #: sink.
    n_tokens: int
    #: A (sample, layer, head) is a sink when its alpha[0] exceeds this: Gu et al.'s epsilon = 0.3
    #: (eval_sink_open_source.py, compute_attention_sink). A head's `is_sink` in heads.csv: its mean
    #: alpha[0] over the samples above it.
    epsilon: float
    #: Samples per forward pass.
    batch_size: int
    #: S2: the early layers that should hold no sink head, 0 .. early_layers - 1 (Xu 2026: layers 0
    #: and 1 of Pythia-1B, OLMo-1B and OLMoE). A model with no more layers than this (the 2-layer
    #: demo models) has no later layer to hold the sinks: S2 is not measurable there, and S1 reads
    #: the whole model.
    early_layers: int
    #: S3: a head "attends almost entirely to the first token" (arXiv 2603.09616's words) when its
    #: mean alpha[0] over the samples is at least this; 0.9 reads "almost entirely" as nine tenths
    #: (a choice: the paper gives no number here).
    first_token_alpha: float


@dataclass(frozen=True)
class PosembedAveragingFields(Settings):
    """The fields of config section ``posembed_averaging`` (its settings class:
    ``posmech.settings.posembed.PosembedAveragingSettings``)."""

    section: ClassVar[str] = "posembed_averaging"

    #: Models analysed; empty: every model.
    models: tuple[str, ...]
    #: Corpus of the loss documents; null: the first corpus. For a model trained by the pipeline on
    #: this corpus, only its held-out documents (every `heldout_every`-th) are used.
    corpus: str | None
    #: Held-out documents (the first ones) of the loss.
    n_documents: int
    #: Group sizes k (1, the intact model, is always added); k ≥ n_ctx averages every row into one.
    ks: tuple[int, ...]
    #: Prompt file (repository-relative or absolute) with the repeat-string prompts and their target
    #: variant sets.
    prompts: str
    #: Prompts of the file scored (P3); each prompt's first target is its scorecard row.
    prompt_ids: tuple[str, ...]
    #: `max_unchanged_k` (P2 scorecard): largest change of the loss from k = 1, either way (|loss(k)
    #: − loss(1)|, nats/token), still "unchanged".
    loss_tolerance: float
    #: `max_unchanged_k` (P2 scorecard): largest absolute change of any prompt-target probability
    #: still "unchanged".
    probability_tolerance: float


@dataclass(frozen=True)
class PosembedAttentionFields(Settings):
    """The fields of config section ``posembed_attention`` (its settings class:
    ``posmech.settings.posembed.PosembedAttentionSettings``)."""

    section: ClassVar[str] = "posembed_attention"

    #: Models analysed; empty: every model.
    models: tuple[str, ...]
    #: Corpus of the document; null: the first corpus.
    corpus: str | None
    #: Which document: the `document`-th one with at least `start + size` tokens (else the longest).
    document: int
    #: First query/key position of the window (clamped so the window fits the document).
    start: int
    #: Window side (the post: 50; clamped to the document length).
    size: int
    #: Group size of the W_pos averaging.
    k: int


@dataclass(frozen=True)
class RotaryFrequenciesFields(Settings):
    """The fields of config section ``rotary_frequencies`` (its settings class:
    ``posmech.settings.rotary.RotaryFrequenciesSettings``)."""

    section: ClassVar[str] = "rotary_frequencies"

    #: Models analysed (rotary ones; others are not measurable); empty: every model.
    models: tuple[str, ...]
    #: Corpus of the documents; null: the first corpus under `corpora`.
    corpus: str | None
    #: Documents (the first ones with `context` tokens) the selectivity and usage are averaged over:
    #: 64 documents of 256 tokens are ~16,000 queries per head, enough for a share to settle to a
    #: few parts in a hundred.
    n_documents: int
    #: Tokens per document, cut to the model's context (the tokens file's n_ctx) when longer: a
    #: positional head such as a previous-token head acts within a few tokens, and the per-pair
    #: scores of one head cost pairs × context² per document, so 256 keeps a 4096-token model's pass
    #: small.
    context: int
    #: Documents per forward pass.
    batch_size: int
    #: Fraction of the rotated pairs in each band (the highest-frequency band of P17, the lowest and
    #: the highest of P18), at least one pair: a quarter splits Barbero et al.'s frequency axis into
    #: the high and low ends they contrast, with half of the pairs between them.
    band_fraction: float
    #: P17's head is the one with the largest previous-token score (mean attention from each query
    #: to the key before it); under this score the model has no previous-token head and P17 is not
    #: measurable. More than half of the attention on the previous key is a previous-token head by
    #: any reading.
    min_previous_token_score: float
