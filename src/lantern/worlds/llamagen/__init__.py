"""The real-model world: published LlamaGen checkpoints and the LANTERN authors' files, each released layout read by
one reader (upstream.py, hf.py; named in lantern.worlds.layouts), text conditions (prompts, T5 caption features)
and real-image drafter data."""
