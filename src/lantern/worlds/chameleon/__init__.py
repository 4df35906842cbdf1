"""The Chameleon-family world (Anole, Lumina-mGPT): their VQGAN, tokenizer vocabulary, prompt templates and prompt
sets, read from the released files unchanged."""
