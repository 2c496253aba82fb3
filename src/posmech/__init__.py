"""posmech: positional mechanisms in attention heads, reproduced as a pipeline.

The library is organised one module per concept (README.md, "Layout"):
``config`` (schema helpers), ``models`` (loading, demo training, hand-built models),
``corpora``, ``tokens``, ``hdf5`` (the artifact schema), ``cli`` (``python -m posmech``).
"""

from posmech.errors import PosmechError

__all__ = ["PosmechError", "__version__"]
__version__ = "0.1.0"
