"""Quality and speed metrics with their protocol.

fidelity.py  FID / KID / precision-recall through torch-fidelity (Inception from a local file, or a domain extractor)
clip.py      CLIP score through open_clip; the toy CLIP's image tower as a torch-fidelity extractor ("toyclip")
train_clip.py  `lantern train-clip`: the toy world's small CLIP (open_clip classes, ClipLoss)
speed.py     tau, forwards, latency, throughput, memory, speed-up from `lantern sample` stats (`lantern speed`)
evaluate.py  `lantern evaluate`: one metrics row per sweep point
"""
