"""Data: corpora (``corpora``), their tokenization into HDF5 (``tokens``) and the prompt
files of the prompt-based analyses (``prompts``)."""
