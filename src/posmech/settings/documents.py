"""Which key of each config section counts a corpus's documents (a twin's sweep point reads a
fraction of them: config ``twins.documents_fraction``, :func:`posmech.pipeline.sweep.thinned`).

Kept with the settings: the keys are the config sections', which share the names of some
analyses (``posembed_averaging``, ``rotary_frequencies``) without naming those analyses."""

from __future__ import annotations

#: ``{config section: its key that counts a corpus's documents}`` (the sections' other counts,
#: e.g. ``attn_only``'s random-token sequences or ``geometry.n_tokens``, are not documents)
DOCUMENT_KEYS = {"taxonomy": "n_documents", "anatomy": "n_documents", "interventions": "n_documents",
                 "posembed_averaging": "n_documents", "rotary_frequencies": "n_documents", "cache": "n_documents",
                 "kernels": "n_chapters", "contextual": "n_per_corpus", "sinks": "n_samples"}
