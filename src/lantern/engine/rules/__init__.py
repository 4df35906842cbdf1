"""The acceptance rules (exact, LANTERN, LANTERN-TV, Cool-SD, GSD) and the codebook neighbour sets they read."""
