"""Analyses: one module per analysis family, each pure functions on arrays plus the small
readers/writers of its own artifacts. ``attention`` holds what several of them share
(head names, previous-token masses, windows); ``geometry`` (P1, P8-P11), ``kernels``
(K1-K5), ``taxonomy`` (P6, P7), ``wpos`` (W_pos interventions, P2-P4),
``interventions`` (P5, P14-P16) and ``score_anatomy`` (raw q·k scores and score taxa,
P12, P13)."""
