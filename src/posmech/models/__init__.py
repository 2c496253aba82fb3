"""Models: fetching or validating a configured model and loading it as a TransformerBridge
(``loading``; a local directory's tokenizer files and weight shapes against its config.json,
``model_dir``), training the demo model (``training``), and hand-built GPT-2-architecture
models whose behaviour is known exactly, for tests (``handbuilt``)."""
