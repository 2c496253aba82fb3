"""Which analysis rule can run on which model, decided from the model's configuration alone.

:data:`RULES` is the table, derived from the analyses' declarations
(``workflow/analyses/<rule>.yaml``, :mod:`posmech.core.families`): for each analysis, the
:data:`REQUIREMENTS` it needs of a model (``needs``) and the analyses whose outputs it reads
(``after``, from its ``reads``). A requirement is a test of the model's
:class:`~posmech.models.architecture.Architecture` (position scheme, MLP, block layout,
whether the posmech engine runs it), read from its config and weights before any job, never
a list of model types. :func:`not_applicable` gives, for one model, every rule
that cannot run on it with the reason in words ("no learned W_pos: rotary positions"); the
workflow does not schedule those rules for the model (``common.smk``: ``collect``), and the
findings of their claims are ``not measurable`` with that reason (:mod:`posmech.verdicts.findings`).

A rule reading the output of a rule that cannot run cannot run either; its reason names
the rule it needs. To make a rule run on more models, change its declaration (drop a
requirement) or the requirement's accepted values (a structural test of the architecture,
never a list of model types where the structure can be read).

Rules not in the table (``fetch_model``, ``tokenize``, ``cache_activations``, the report)
run on every model. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from posmech.core.families import ANALYSES, FAMILIES
from posmech.models.architecture import Architecture


@dataclass(frozen=True)
class Requirement:
    """What a rule needs of a model: a position scheme among ``schemes``, an MLP (``mlp``), a
    LayerNorm before each block rather than after each residual addition (``pre_ln``), the
    posmech engine running it for the schemes ``engine_for`` (``Architecture.engine_refusal``,
    decided from its config by the engine itself, :func:`posmech.models.lens.unsupported_hf`:
    a model type nobody listed here is in or out as the engine is); ``None``/False: anything.
    ``reason`` says in words why a model that fails it cannot run the rule; ``{positions}``
    (the scheme in words), ``{model_type}`` and ``{unmet}`` (what of the model fails which
    test, in words) are filled in. Structural tests, read from the model's config and weights
    (:class:`~posmech.models.architecture.Architecture`): ``rotary_pairs``, a rotary model's
    pair order is told and computed: the two halves of its rotated dimensions, or adjacent
    dimensions (GPT-J's interleaved pairs) on a model type the posmech engine rotates so
    (:data:`INTERLEAVED_TYPES`; the bridge records no rotation for them); ``plain_scores``,
    the scores are ``q·k / scale`` (plus ALiBi's bias), not soft-capped (Gemma 2's
    ``attn_logit_softcapping``)."""

    reason: str
    schemes: tuple[str, ...] | None = None
    mlp: bool = False
    pre_ln: bool = False
    rotary_pairs: bool = False
    plain_scores: bool = False
    #: the schemes for which the posmech engine must run the model (its config, not only its
    #: type: a Falcon of the 40B layout, a Phi with qk_layernorm are refused; Architecture.engine_refusal)
    engine_for: tuple[str, ...] | None = None

    def unmet(self, arch: Architecture) -> list[str]:
        """What of ``arch`` fails the requirement, in words (empty: it meets it)."""
        out = []
        if self.schemes is not None and arch.positions not in self.schemes:
            out.append(arch.scheme_words)
        if self.engine_for is not None and arch.positions in self.engine_for and arch.engine_refusal:
            out.append(f"the posmech engine does not run it ({arch.engine_refusal})")
        if self.mlp and not arch.has_mlp:
            out.append("no MLP")
        if self.pre_ln and arch.post_ln:
            out.append("LayerNorm after each residual addition")
        if self.rotary_pairs and arch.positions == "rotary" and arch.rotary_interleaved is None:
            out.append("a rotary pair order that cannot be told (halves or interleaved)")
        if (self.rotary_pairs and arch.positions == "rotary" and arch.rotary_interleaved
                and arch.model_type not in INTERLEAVED_TYPES):
            out.append("interleaved rotary pairs (adjacent dimensions, rotate_every_two) of a model type the posmech "
                       f"engine does not run (it rotates those of {', '.join(INTERLEAVED_TYPES)}), and the bridge "
                       "records no rotation (hook_cos/hook_sin) for them")
        if self.plain_scores and arch.score_softcap is not None:
            out.append(f"attention scores soft-capped at {arch.score_softcap:g} (c·tanh(q·k/(scale·c)), "
                       "attn_logit_softcapping)")
        return out

    def why_not(self, arch: Architecture) -> str | None:
        """``None`` when ``arch`` meets the requirement, else the reason in words."""
        unmet = self.unmet(arch)
        return None if not unmet else self.reason.format(positions=arch.scheme_words, model_type=arch.model_type,
                                                         unmet="; ".join(unmet))


#: model types with interleaved rotary pairs the posmech engine runs, recording their rotation
#: (``hook_cos``/``hook_sin``, :mod:`posmech.models.lens`); TransformerLens 4.3's bridge records none
#: for GPT-J
INTERLEAVED_TYPES = ("gptj",)

REQUIREMENTS: dict[str, Requirement] = {
    # a learned absolute positional embedding W_pos added to the residual stream: what the
    # P geometry, the W_pos averaging, the positional kernels (Gibson's kernel is defined
    # against it) and the L rules' position-only inputs study
    "learned_wpos": Requirement("no learned W_pos: {positions}", schemes=("learned",)),
    # queries and keys rotated by position: what the rotary frequency analysis (P17, P18) splits
    "rotary": Requirement("no rotary frequencies: {positions}", schemes=("rotary",)),
    # the L rules' position-only and token-only inputs (posmech.analyses.attn_only.variant_input,
    # docs/claims.md): learned positions zero hook_embed / hook_pos_embed, a model without
    # positional encoding needs nothing; rotary and ALiBi models run every token at position 0
    # for the token-only input, which the posmech engine does (posmech.models.lens: `positions`)
    # for every model it runs (its own decision from the config, Architecture.engine_refusal)
    "position_variants": Requirement(
        "the token-only input of {positions} runs every token at position 0, which only the posmech engine does, "
        "and it does not run this {model_type}: {unmet}", engine_for=("rotary", "alibi")),
    # the attention scores before the softmax (P12, P13, the taxonomy's statistics, the
    # positional kernels): q·k·scale for learned positions, q and k rotated at their positions
    # for rotary heads (the halves convention of posmech.models.scores.rotate), the ALiBi bias
    # added for ALiBi heads (posmech.models.scores.ScoreFunction, tested against Hugging Face's
    # own scores on tiny Llama, GPT-NeoX and BLOOM models); grouped-query and multi-query key
    # heads are repeated per query group. Decided from the structure read from the model's
    # config and weights, not its model type; what the score function does not compute
    # (a rotary pair order that cannot be told) is named; GPT-J's interleaved pairs are rotated
    # as the model does (ScoreFunction.interleaved, tested against Hugging Face's GPT-J:
    # tests/models/test_gptj.py) where the posmech engine runs them; soft-capped scores (Gemma 2) are computed
    # (ScoreFunction.cap). At run time the raw scores are checked against the forward's own
    # hook_attn_scores (posmech.analyses.anatomy): a model whose forward records something
    # else there fails that analysis on that model, reported with its log
    "raw_scores_layout": Requirement("raw attention scores of {model_type} are not computed by posmech's score "
                                     "function: {unmet}", schemes=("learned", "rotary", "alibi"),
                                     rotary_pairs=True),
    # the positional kernels score each position's corpus-mean key (posmech.analyses.kernels.head_kernels):
    # the mean score over the corpus, and the key bias's constant cancelling in the softmax, only
    # while the score is linear in the key. A model that soft-caps its scores (Gemma 2) attends
    # with c·tanh(q·k/(scale·c)), which is not: its kernel (the attention with the keys' content
    # averaged out) is not defined. What needs only the model's own scores or patterns (the raw
    # scores, the taxonomy, P17/P18's split of the logit before its cap) runs on it
    "plain_scores": Requirement("the positional kernels score each position's mean key, the mean score only while "
                                "the score is linear in the key (q·k/scale), and {model_type}'s is not: {unmet}",
                                plain_scores=True),
    # the layer-0 decomposition reads layer 0 as the posmech engine holds it: a learned-position
    # model's W_E, W_pos, LayerNorm and W_Q/W_K from the engine's converted weights
    # (posmech.models.lens.hf_state; GPT-2 and GPT-Neo from their own names; OPT's W_pos from
    # row 2; grouped- and multi-query key heads repeated per query head: GPT-BigCode), a rotary,
    # ALiBi or position-free model's from one-token forward passes of the engine
    # (posmech.analyses.contextual.relative); the contextual neurons read the value/output and
    # MLP weights of every layout the engine runs (posmech.models.mlp_layouts). Decided by the
    # engine from the config (Architecture.engine_refusal), not by a list of model types
    "layer0_weights": Requirement(
        "the layer-0 decomposition reads layer 0 through the posmech engine (its converted weights, or one-token "
        "forward passes for {positions}), and it does not run this {model_type}: {unmet}",
        engine_for=("learned", "rotary", "alibi", "none")),
    # the decomposition splits LN(e + p): a LayerNorm of the residual that layer 0's attention
    # reads; a post-LayerNorm block (OPT's do_layer_norm_before: false) reads the raw residual
    "pre_ln": Requirement("LayerNorm after each residual addition (OPT's do_layer_norm_before: false): layer 0's "
                          "attention reads the raw residual, not the LayerNorm of it that the decomposition splits",
                          pre_ln=True),
    # the contextual neurons read the value/output and MLP weights of every layout of
    # posmech.models.mlp_layouts (plain or gated MLP, sequential or parallel block): a block
    # whose weights have none of them, or without the object (a single parallel layer), is decided from its weights in the job, and C1-C3 are not measurable with the reason
    "mlp": Requirement("no MLP in layer 0 (an attention-only model)", mlp=True),
}


@dataclass(frozen=True)
class Needs:
    """One rule's entry: the names of its :data:`REQUIREMENTS` and the analysis rules whose
    outputs it reads."""

    requires: tuple[str, ...] = ()
    after: tuple[str, ...] = ()


#: every declared analysis's entry (workflow/analyses/<rule>.yaml): its ``needs`` and the
#: analyses whose outputs it ``reads``
RULES: dict[str, Needs] = {a.name: Needs(a.needs, a.after) for a in ANALYSES.values()}


def family_problems(arch: Architecture | None, families: Mapping[str, tuple[str, ...]] = FAMILIES,
                    rules: Mapping[str, Needs] = RULES) -> list[str]:
    """Families that a model of architecture ``arch`` would split: some analyses applicable,
    others not (each named with its reason). ``None`` (an architecture not known before
    the run) splits none: every analysis is scheduled and checks at run time."""
    out: list[str] = []
    if arch is None:
        return out
    for family, analyses in families.items():
        whys = {a: why_not(a, arch, rules) for a in analyses}
        if len({w is None for w in whys.values()}) > 1:
            out.append(f"family {family}: " + "; ".join(f"{a}: {w or 'applicable'}" for a, w in whys.items()))
    return out


def why_not(rule: str, arch: Architecture, rules: Mapping[str, Needs] = RULES,
            requirements: Mapping[str, Requirement] = REQUIREMENTS) -> str | None:
    """``None`` when ``rule`` can run on a model of architecture ``arch``, else the reason in
    words (its own first unmet requirement, else that of the first rule it reads). No rule of
    the table runs on a model whose position scheme cannot be told (``unknown``): the reason
    says why it cannot."""
    needs = rules.get(rule)
    if needs is None:
        return None
    if arch.positions == "unknown":
        return f"position scheme not decided before the run: {arch.undecided}"
    for req in needs.requires:
        why = requirements[req].why_not(arch)
        if why is not None:
            return why
    for up in needs.after:
        why = why_not(up, arch, rules, requirements)
        if why is not None:
            return f"{why} (it needs rule {up})" if "(it needs rule" not in why else why
    return None


def not_applicable(arch: Architecture | None, rules: Mapping[str, Needs] = RULES) -> dict[str, str]:
    """``{rule: reason}`` of every rule of the table that cannot run on a model of
    architecture ``arch``; nothing when the architecture is not known (``None``: a Hub
    model neither fetched nor in the local cache, whose rules check at run time)."""
    if arch is None:
        return {}
    out = {}
    for rule in rules:
        why = why_not(rule, arch, rules)
        if why is not None:
            out[rule] = why
    return out


def check_table(rules: Mapping[str, Needs] = RULES, requirements: Mapping[str, Requirement] = REQUIREMENTS) -> list[str]:
    """Problems of the table itself: an unknown requirement, an ``after`` rule not in the table."""
    out = []
    for rule, needs in rules.items():
        out += [f"{rule}: unknown requirement {r!r}" for r in needs.requires if r not in requirements]
        out += [f"{rule}: reads rule {u!r}, which is not in the table" for u in needs.after if u not in rules]
    return out


class Schedule:
    """Which analysis runs on which model of one config: ``not_applicable`` (``{model:
    {rule: reason}}``, :func:`not_applicable` of each model's architecture), and on a
    checkpoint (``checkpoint_of``) only the rules the dynamics sweep follows
    (``sweep_rules``, :func:`posmech.verdicts.dynamics.sweep_rules`)."""

    def __init__(self, not_applicable: Mapping[str, Mapping[str, str]], checkpoint_of: Mapping[str, str],
                 sweep_rules: set[str]) -> None:
        self.not_applicable, self.checkpoint_of, self.sweep_rules = not_applicable, checkpoint_of, sweep_rules

    def runs_on(self, rule: str, models: list[str]) -> list[str]:
        """The models of ``models`` that analysis ``rule`` can run on."""
        return [m for m in models if rule not in self.not_applicable.get(m, {})
                and (m not in self.checkpoint_of or rule in self.sweep_rules)]

    def notes(self, architectures: Mapping[str, Architecture | None]) -> list[str]:
        """One line per model (not a checkpoint) that some analysis rules skip, for the terminal."""
        return [
            f"posmech: model {m} ({architectures[m].scheme_words}, "  # type: ignore[union-attr]
            f"{architectures[m].model_type}): {len(skipped)} analysis rules do not apply and "  # type: ignore[union-attr]
            "are not scheduled; their claims are `not measurable` with the reason "
            "(results/report/findings.csv, docs/workflow.md)"
            for m, skipped in self.not_applicable.items() if skipped and m not in self.checkpoint_of
        ]
