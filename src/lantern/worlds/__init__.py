"""The worlds a run can live in: the toy world (procedural data, trained small models) and the published LlamaGen world."""
