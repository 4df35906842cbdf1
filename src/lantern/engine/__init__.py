"""The decoding engine, in rooms that import one way (tests/test_layers.py): models/ (the networks and their files)
<- rules/ (the acceptance rules and the neighbour sets they read) <- decoding/ (sampling, plain AR, the speculative
loop, its drafting kinds and their rounds) <- methods.py (the registry of every decoding method)."""
