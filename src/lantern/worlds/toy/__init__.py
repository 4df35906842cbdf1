"""The toy world: procedurally generated images and the trainers of its VQ, target and data."""
