"""`lantern tokenize`: encode a `lantern make-data` file into VQ code indices for the GPT and the drafter."""

from __future__ import annotations

import argparse

import torch
from tqdm import tqdm

from lantern.worlds.llamagen.upstream import load_vq
from lantern.io import save_torch
from lantern.worlds.toy.data import load_data, to_unit


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="lantern tokenize", description="encode a dataset into VQ code indices")
    ap.add_argument("--data", required=True, help="`lantern make-data` file")
    ap.add_argument("--vq", required=True, help="VQ checkpoint from `lantern train-vq`")
    ap.add_argument("--out", required=True, help="torch file: tokens LongTensor [n, h*w], labels, captions")
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    a = ap.parse_args(argv)
    data = load_data(a.data, "--data")
    vq = load_vq(a.vq)
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    images, chunks = data["images"], []
    for lo in tqdm(range(0, len(images), a.batch), desc="tokenize", mininterval=2.0):
        chunks.append(vq.encode(to_unit(images[lo : lo + a.batch])))
    tokens = torch.cat(chunks)
    out = {"tokens": tokens, "labels": data["labels"], "captions": data["captions"],
           "codebook_size": vq.args.codebook_size, "vq": str(a.vq), "data": str(a.data)}
    save_torch(out, a.out)
    print(f"tokenized {len(tokens)} images into {tokens.shape[1]} tokens each -> {a.out}")
