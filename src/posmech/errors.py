"""The project's one exception type.

Every error a user can cause (bad config, missing file, unreachable hub, corrupt
artifact) is raised as :class:`PosmechError` with a message that names the key or
file and says what to do.  Scripts run by Snakemake print only that message (no
traceback wall) via :func:`posmech.runner.run`.
"""


class PosmechError(RuntimeError):
    """A user-facing error: the message names the key/file and the fix."""


HUB_HINT = (
    "The Hugging Face Hub is unreachable from this machine. Two ways on: run the offline "
    "default with `snakemake --cores 8 --configfile config/demo.yaml`, or point the "
    "entry's `source` at a local copy (a Hugging Face model directory such as "
    "`/data/gpt2`, or for a corpus a dataset directory / .jsonl / .parquet file)."
)
