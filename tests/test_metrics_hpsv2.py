"""HPS v2.1 on a tiny random OpenCLIP (config and weights written here, nothing downloaded): the score is the
cosine of the normalised image and text features, computed by hand here from the model's raw towers; HPS's training
checkpoint layout loads; a missing weights file is one line naming hpsv2.weights_path."""

import json

import open_clip
import pytest
import torch
import torch.nn.functional as F

from lantern.errors import UserError
from lantern.metrics.hpsv2 import HPSv2Params, check_hpsv2, hps_scores, load_hpsv2


@pytest.fixture(scope="module")
def tiny_hps(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hps")
    cfg = {"embed_dim": 16, "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "patch_size": 16,
                                           "head_width": 16},
           "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1}}
    (folder / "tiny-hps.json").write_text(json.dumps(cfg))
    open_clip.add_model_config(folder / "tiny-hps.json")
    torch.manual_seed(0)
    net = open_clip.create_model("tiny-hps").eval()
    # HPS's release is a training checkpoint: {"state_dict": ...}, DDP's "module." prefix where present
    torch.save({"state_dict": {f"module.{k}": v for k, v in net.state_dict().items()}}, folder / "tiny-hps.pt")
    return folder, net


def test_score_is_the_cosine_of_normalised_features(tiny_hps):
    folder, ref = tiny_hps
    net, tok = load_hpsv2(HPSv2Params(enabled=True, model="tiny-hps", weights_path=str(folder / "tiny-hps.pt")))
    torch.manual_seed(1)
    images = torch.randint(0, 256, (5, 3, 32, 32), dtype=torch.uint8)  # at the model's size: no resize
    prompts = ["a red cat", "a blue dog", "a hawk-man with a red head", "starry sky", "a zebra"]
    scores = hps_scores(net, tok, images, prompts, batch_size=2)
    mean, std = torch.tensor([0.48145466, 0.4578275, 0.40821073]), torch.tensor([0.26862954, 0.26130258, 0.27577711])
    with torch.no_grad():
        img = ref.encode_image((images.float() / 255 - mean.view(1, 3, 1, 1)) / std.view(1, 3, 1, 1))
        txt = ref.encode_text(open_clip.get_tokenizer("tiny-hps")(prompts))
    expected = (F.normalize(img, dim=-1) * F.normalize(txt, dim=-1)).sum(-1)
    assert scores.shape == (5,) and torch.allclose(scores, expected, atol=1e-5)
    assert scores.abs().max() <= 1 and scores.std() > 0  # a cosine, not times logit_scale, and prompt-dependent
    # the prompt goes in as given (no CLIP-score prefix): a prefix changes the score
    prefixed = hps_scores(net, tok, images, ["A photo depicts " + p for p in prompts])
    assert not torch.allclose(prefixed, scores)


def test_missing_weights_is_one_line(tmp_path):
    with pytest.raises(UserError, match=r"HPS v2.1 weights not found at .*none\.pt.*hpsv2\.weights_path") as e:
        check_hpsv2(HPSv2Params(enabled=True, weights_path=str(tmp_path / "none.pt")))
    assert "\n" not in str(e.value)
    with pytest.raises(UserError, match="hpsv2.weights_path is empty"):
        load_hpsv2(HPSv2Params())
    check_hpsv2(HPSv2Params(enabled=False))  # disabled: nothing is needed
    with pytest.raises(UserError, match="batch_size"):
        HPSv2Params(batch_size=0)
