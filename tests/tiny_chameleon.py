"""Tiny random Chameleon targets built by transformers' own classes (ChameleonForConditionalGeneration), written to
disk as HF safetensors shards, and read back through worlds/chameleon/hf.py (reference chameleon-targets.md 8)."""
import torch
from transformers import ChameleonConfig, ChameleonForConditionalGeneration

from lantern.engine.models.chameleon_load import chameleon_from_hf
from lantern.worlds.chameleon.hf import read_target_folder

LETTERS = "ABCDEFGHIJ"


def image_token_name(code: int) -> str:
    return "IMGIMG" + "".join(LETTERS[int(d)] for d in str(code)) + "Z"


def hf_config(vocab=64, codes=16, swin=False, layers=2):
    """transformers needs the vocabulary map (image token names at ids 4..) at construction."""
    names = {image_token_name(c): c + 4 for c in range(codes)}
    return ChameleonConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                           num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128,
                           swin_norm=swin, vocabulary_map={"<image>": vocab - 1, **names},
                           vq_config=dict(embed_dim=8, num_embeddings=16, latent_channels=8, base_channels=32,
                                          channel_multiplier=[1, 2], resolution=16))


def hf_model(vocab=64, codes=16, swin=False, seed=0, shared_norm=False, std=0.3):
    """A float64 HF Chameleon with every trunk weight random (qk-norm gammas and betas per head, or one row shared
    by the heads as in Lumina's [1, hd] files)."""
    torch.manual_seed(seed)
    model = ChameleonForConditionalGeneration(hf_config(vocab, codes, swin)).double().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "vqmodel" in name:
                continue
            if name.endswith("norm.weight") or "layernorm" in name:
                p.copy_(1 + std * torch.randn_like(p))
            else:
                p.normal_(0, std)
            if shared_norm and "_norm." in name:
                p.copy_(p[:1].expand_as(p))
    return model


def save_shards(model, folder):
    """save_pretrained with small shards, so that the reader sees an index and many files."""
    model.save_pretrained(folder, max_shard_size="40KB")
    return folder


def ours_from(folder, dtype=torch.float64, **layout):
    args, sd, where = read_target_folder(folder, **layout)
    return chameleon_from_hf(args, sd, folder, where, dtype=dtype)


def hf_logits(model, ids, pos=None):
    """(post-norm hidden, full logits) of the HF trunk + lm_head (ChameleonForConditionalGeneration would set the
    image logits to finfo.min)."""
    with torch.no_grad():
        h = model.model(input_ids=ids, position_ids=pos).last_hidden_state
        return h, model.lm_head(h)
