"""The networks and their files: the LlamaGen-family GPT and KV cache, the VQ tokenizer, the EAGLE drafter, checkpoint formats."""
