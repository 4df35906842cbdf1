"""The decoding engine: LlamaGen-family models and VQ, sampling, acceptance rules, chain and tree decoders, drafter, neighbours."""
