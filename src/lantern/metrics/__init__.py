"""Quality and speed metrics with their protocol.

fidelity.py  FID / KID / precision-recall through torch-fidelity (Inception from a local file, VGG16 for
             precision/recall, or a domain extractor)
reference.py the reference set: images, or precomputed FID statistics (ADM / LlamaGen .npz with mu, sigma)
images.py    image sets and the one resize + centre crop applied to generated and reference images alike
clip.py      CLIP score (and raw cosine) through open_clip; the toy CLIP's image tower as a torch-fidelity extractor
captions.py  captions per image: stats.csv captions, or class labels named by the toy, ImageNet or a file's names
train_clip.py  `lantern train-clip`: the toy world's small CLIP (open_clip classes, ClipLoss)
speed.py     tau, forwards, latency, throughput, memory, speed-up from `lantern sample` stats (`lantern speed`)
evaluate.py  `lantern evaluate`: one metrics row per sweep point
proximity.py `lantern proximity`: latent proximity (LANTERN Fig. 3): decodes with tokens swapped for their m-th
             nearest codebook neighbour, scored against the unmodified decodes
"""
