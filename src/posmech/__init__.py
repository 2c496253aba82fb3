"""posmech: positional mechanisms in attention heads, reproduced as a pipeline.

The folders follow the data flow (README.md, "Layout"):

* ``data/`` — corpora, tokenization, prompt files;
* ``models/`` — fetching/loading models, training the demo model, hand-built models;
* ``cache`` — the forward-pass engine and the activation cache;
* ``analyses/`` — one module per analysis family, ``analyses.attention`` shared by them;
* ``plots/`` — one module of figures per analysis family;
* ``report/`` — scorecard, HTML report, browser check.

Infrastructure stays at the top: ``config`` (schema helpers), ``errors``, ``io``,
``hdf5`` (the artifact schema), ``tables`` (tidy CSV), ``runner`` (script glue),
``cluster`` (resource estimates), ``cli`` (``python -m posmech``).
"""

from posmech.core.errors import PosmechError

__all__ = ["PosmechError", "__version__"]
__version__ = "0.1.0"
