"""Text around a model: the tokenizer, the chat template, sampling.

- pyq2.text.tokenizer: `Tokenizer` (byte-level BPE from a GGUF file's tokenizer.ggml.* metadata,
  Qwen2 / Qwen3.5 pre-tokenizers; `tokenizers` or pure-Python backend) and `StreamDecoder`.
- pyq2.text.chat: `render_chat` (the file's jinja chat template, sandboxed as transformers renders
  it, or built-in ChatML).
- pyq2.text.sampling: `SamplingParams`, `sample_numpy` / `sample_torch` (one semantics, the same
  token for the same uniforms) and `StopChecker` for stop strings over streamed text.
- pyq2.text.demo_vocab: `demo_tokenizer_metadata`, a small valid vocabulary for the demo model.

Each module imports no other pyq2 module but pyq2.errors, and none of them is imported here.
"""
