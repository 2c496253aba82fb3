"""Analyses: one module or package per analysis family, named as the family
(docs/workflow.md, "Families"), each pure functions on arrays plus the small
readers/writers of its own artifacts: ``taxonomy`` (P6, P7; its ``statistics`` the pass
shared with ``anatomy``), ``anatomy`` (raw q·k scores and score taxa, P12, P13),
``geometry`` (P1, P8-P11), ``interventions`` (P5, P14-P16), ``kernels`` (K1-K5),
``contextual`` (K6-K10), ``neurons`` (C1-C3), ``attn_only`` (L1-L5); ``posembed`` the
posembed rules (W_pos averaged, P2-P4). Shared helpers that belong to no family:
``attention`` (head names, previous-token masses, windows, one pass for several
collectors), ``readout`` (logits and target probabilities) and ``cache`` (the activation
cache)."""
