"""The real-model world: published LlamaGen checkpoints, text conditions (prompts, T5 caption features), real-image
drafter data and converters for the LANTERN authors' files."""
