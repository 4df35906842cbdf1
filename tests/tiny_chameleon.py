"""Tiny random Chameleon targets built by transformers' own classes (ChameleonForConditionalGeneration), written to
disk as HF safetensors shards, and read back through worlds/chameleon/hf.py (reference chameleon-targets.md 8)."""
import torch
from transformers import ChameleonConfig, ChameleonForConditionalGeneration

from lantern.engine.models.chameleon_load import chameleon_from_hf
from lantern.worlds.chameleon.hf import read_target_folder

LETTERS = "ABCDEFGHIJ"


def image_token_name(code: int) -> str:
    return "IMGIMG" + "".join(LETTERS[int(d)] for d in str(code)) + "Z"


def hf_config(vocab=64, codes=16, swin=False, layers=2, positions=128):
    """transformers needs the vocabulary map (image token names at ids 4..) at construction."""
    names = {image_token_name(c): c + 4 for c in range(codes)}
    return ChameleonConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                           num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=positions,
                           swin_norm=swin, vocabulary_map={"<image>": vocab - 1, **names},
                           vq_config=dict(embed_dim=8, num_embeddings=16, latent_channels=8, base_channels=32,
                                          channel_multiplier=[1, 2], resolution=16))


def hf_model(vocab=64, codes=16, swin=False, seed=0, shared_norm=False, std=0.3, positions=128):
    """A float64 HF Chameleon with every trunk weight random (qk-norm gammas and betas per head, or one row shared
    by the heads as in Lumina's [1, hd] files)."""
    torch.manual_seed(seed)
    model = ChameleonForConditionalGeneration(hf_config(vocab, codes, swin, positions=positions)).double().eval()
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


def write_world(root, positions=256, seed=0):
    """A tiny Chameleon world in the released layouts: the HF target folder (vocabulary 8864 with the real id
    layout, 8192 codes), tokenizer/vqgan.ckpt + vqgan.yaml (8192 codes, stride 2), tokenizer.json with Chameleon's
    vocabulary, and the authors' drafter folder for the target (their keys: the target's embedding, fc with bias,
    one transformers Chameleon layer). Returns load_chameleon's file arguments."""
    import json

    from test_chameleon_text import chameleon_vocab, write_tokenizer
    from test_chameleon_vq import random_state_dict, write_vqgan

    model = hf_model(vocab=8864, codes=8192, std=0.5, seed=seed, positions=positions)
    model.save_pretrained(root / "target")
    write_vqgan(root / "tokenizer", random_state_dict(n_embed=8192))
    write_tokenizer(root / "tokenizer.json", chameleon_vocab())
    layer = hf_model(seed=seed + 1, std=0.3).model.layers[0]
    torch.manual_seed(seed)
    fc = torch.nn.Linear(64, 32).double()
    sd = {"embed_tokens.weight": model.model.embed_tokens.weight.detach().clone(), "fc.weight": fc.weight.detach(),
          "fc.bias": fc.bias.detach(), **{f"layers.0.{k}": v for k, v in layer.state_dict().items()}}
    (root / "drafter").mkdir(parents=True, exist_ok=True)
    cfg = dict(model.config.to_dict(), num_hidden_layers=1, bias=True)
    (root / "drafter" / "config.json").write_text(json.dumps(cfg, default=str))
    torch.save(sd, root / "drafter" / "pytorch_model.bin")
    return {"target": root / "target", "vqgan_ckpt": root / "tokenizer" / "vqgan.ckpt",
            "tokenizer": root / "tokenizer.json", "drafter": root / "drafter"}
