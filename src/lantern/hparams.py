"""The hyperparameter groups of the pipeline's training and report jobs (toy data, VQ, target, drafter, CLIP,
classifier, ambiguity report), kept apart from the code that uses them so that they import without torch: the
config check builds every group before any job (`pipeline.config.validate_config`), and it runs at every Snakemake
start, twice in each SLURM job. The modules that use a group import it from here."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from lantern.errors import UserError
from lantern.params import check_layer_indices, check_threads

if TYPE_CHECKING:
    from lantern.engine.models.model import ModelArgs
    from lantern.engine.decoding.sampling import SamplingParams
    from lantern.engine.models.vq import VQArgs

# Ordered most distinct first, so that a world of the first n classes is as separable as n classes can be at
# 8 x 8 tokens: the order greedily adds the class that keeps a 16-class target's Bayes accuracy highest (issue #31).
CLASS_NAMES = (
    "circle", "triangle", "star", "ring", "L-shape", "frame", "cross", "square",
    "ellipse", "arrow", "crescent", "pentagon", "hexagon", "heart", "T-shape", "semicircle",
)
PROMPT_PREFIX = "A photo depicts "


# -- toy data (lantern.worlds.toy.data) ----------------------------------------------------------------------------
@dataclass
class DataParams:
    image_size: int = 32
    num_classes: int = 16
    min_size: float = 0.20         # shape radius as a fraction of the image side
    max_size: float = 0.38
    colour_jitter: float = 0.06    # per-channel uniform jitter of the shape colour
    background_gradient: bool = True   # False: one flat background colour
    background_dim: float = 0.75   # backgrounds are dimmed towards grey so the shape stands out
    texture_amplitude: float = 0.12    # sinusoidal stripes on the background (0: none)
    min_stripes: float = 2.0       # stripe frequency range, cycles per image side
    max_stripes: float = 6.0
    noise_sigma: float = 0.04      # Gaussian pixel noise on the whole image (0: none)

    def __post_init__(self):
        if self.image_size < 8:
            raise UserError(f"data image_size must be >= 8, got {self.image_size}")
        if not 1 <= self.num_classes <= len(CLASS_NAMES):
            raise UserError(f"data num_classes must be in 1..{len(CLASS_NAMES)}, got {self.num_classes}")
        if not 0 < self.min_size <= self.max_size <= 0.5:
            raise UserError(f"data sizes need 0 < min_size <= max_size <= 0.5, got {self.min_size}, {self.max_size}")
        if self.texture_amplitude < 0 or self.noise_sigma < 0 or self.colour_jitter < 0:
            raise UserError("data texture_amplitude, noise_sigma and colour_jitter must be >= 0")


# -- toy VQ (lantern.worlds.toy.train_vq) --------------------------------------------------------------------------
@dataclass
class VQParams:
    # model (VQArgs fields; defaults are the toy world's: 32 px -> 8 x 8 tokens, 512 codes of dim 8)
    codebook_size: int = 512
    codebook_embed_dim: int = 8
    ch: int = 32
    ch_mult: tuple[int, ...] = (1, 1, 2)
    z_channels: int = 64
    enc_res_blocks: tuple[int, ...] = (0, 1, 2)  # none at full resolution: 3x3 convs there dominate CPU time
    dec_res_blocks: tuple[int, ...] = (2, 2, 0)
    norm_groups: int = 8
    commit_beta: float = 0.25
    # training
    steps: int = 800
    batch_size: int = 32  # more small steps beat fewer big ones at equal compute (probe: 400 x 32 > 200 x 64)
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 30
    weight_decay: float = 0.0
    l1_weight: float = 0.0
    restart_every: int = 50  # 0: no dead-code restarts
    restart_until: float = 0.8  # fraction of training after which codes are left alone to settle
    eval_batch: int = 256
    seed: int = 0

    def vq_args(self) -> VQArgs:
        from lantern.engine.models.vq import VQArgs

        names = {f.name for f in dataclasses.fields(VQArgs)}
        try:
            return VQArgs(**{k: v for k, v in dataclasses.asdict(self).items() if k in names})
        except ValueError as e:
            raise UserError(f"VQ model config: {e}") from None

    def __post_init__(self):
        if self.steps < 1 or self.batch_size < 1:
            raise UserError(f"VQParams steps and batch_size must be >= 1, got {self.steps}, {self.batch_size}")
        if self.codebook_size < 2:
            raise UserError(f"VQParams codebook_size must be >= 2, got {self.codebook_size}")


# -- toy target (lantern.worlds.toy.train_gpt) ---------------------------------------------------------------------
@dataclass
class GPTParams:
    # model (the default is >= 1M parameters: expensive enough per forward that speculative decoding pays off on
    # a CPU; smoke preset: dim 64, n_layer 2, n_head 2)
    dim: int = 128
    n_layer: int = 6
    n_head: int = 4
    multiple_of: int = 64
    num_classes: int = 16
    class_dropout_prob: float = 0.1
    # training
    steps: int = 1500
    batch_size: int = 64
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    weight_decay: float = 0.05
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    eval_every: int = 250
    eval_batch: int = 256
    seed: int = 0
    # optimizer steps between resume checkpoints (<out>.resume.pt, deleted once the target is written): a killed or
    # retried job resumes there and ends with the weights of an uninterrupted run (same machine and thread count)
    checkpoint_every: int = 500

    def __post_init__(self):
        if self.steps < 1 or self.batch_size < 1:
            raise UserError(f"GPTParams steps and batch_size must be >= 1, got {self.steps}, {self.batch_size}")
        if isinstance(self.checkpoint_every, bool) or not isinstance(self.checkpoint_every, int) \
                or self.checkpoint_every < 0:
            raise UserError(f"GPTParams checkpoint_every={self.checkpoint_every!r} must be an integer >= 0 "
                            "(optimizer steps; 0: none)")
        if not 0 <= self.class_dropout_prob < 1:
            raise UserError(f"GPTParams class_dropout_prob must be in [0, 1), got {self.class_dropout_prob}")

    def model_args(self, vocab_size: int, image_tokens: int) -> ModelArgs:
        from lantern.engine.models.model import ModelArgs

        return ModelArgs(dim=self.dim, n_layer=self.n_layer, n_head=self.n_head, vocab_size=vocab_size,
                         num_classes=self.num_classes, image_tokens=image_tokens, multiple_of=self.multiple_of,
                         class_dropout_prob=self.class_dropout_prob)


# -- drafter (lantern.pipeline.train_drafter) ----------------------------------------------------------------------
@dataclass
class DrafterParams:
    data: str = "real"  # real: teacher-forced on --tokens; self: on the target's own samples; both
    n_self: int = 0  # self-generated sequences (data self / both)
    self_sampling: dict = field(default_factory=dict)  # SamplingParams for the self-generated sequences
    epochs: int = 20
    batch_size: int = 32
    lr: float = 1e-4
    # constant: lr throughout; cosine: from lr down to lr * lr_floor over the run's optimizer steps, so the last
    # epochs refine rather than hop (the step's lr is a function of the step: a resumed run follows the same curve)
    lr_schedule: str = "constant"
    lr_floor: float = 0.0
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.0
    grad_clip: float = 0.5  # clip each gradient value to [-0.5, 0.5] (EAGLE)
    ce_weight: float = 0.1
    hidden_noise: float = 0.1  # uniform noise in [-a, a] on the input hidden states
    # the share of training rows whose condition becomes the null condition (the uncond stream CFG needs); null:
    # the target's class_dropout_prob (LlamaGen), the authors' 0.1 (Chameleon: the family's uncond prompt)
    cond_dropout: float | None = None
    # chain steps trained per position: 1 = EAGLE-1 (every step teacher-forced on the target's hidden states); n > 1
    # also trains steps 2..n fed the drafter's own predictions, as decoding feeds them (a training-time test, as in
    # HASS and EAGLE-3), each step's loss added with the same weights
    unroll: int = 1
    # target layers (0-based, increasing, below the last) whose outputs the drafter also reads, fused with h_t (as
    # EAGLE-3); [] = EAGLE-1, the target's last hidden state only
    feature_layers: list[int] = field(default_factory=list)
    val_frac: float = 0.05
    max_sequences: int = 0  # 0: all
    seed: int = 0
    threads: int = 0
    # optimizer steps between resume checkpoints (<out>.resume.pt, deleted once the drafter is written): a retried
    # job goes on from the last one with the same final weights; 0: none
    checkpoint_every: int = 1000

    def __post_init__(self):
        self.betas = tuple(self.betas)
        check_threads(self.threads, "drafter")
        every = self.checkpoint_every
        if isinstance(every, bool) or not isinstance(every, int) or every < 0:
            raise UserError(f"drafter checkpoint_every={every!r} must be an integer >= 0 (optimizer steps; 0: none)")
        if self.data not in ("real", "self", "both"):
            raise UserError(f"drafter data must be real, self or both; got {self.data!r}")
        if self.data != "real" and self.n_self < 1:
            raise UserError(f"drafter data {self.data} needs n_self >= 1 self-generated sequences")
        if self.lr_schedule not in ("constant", "cosine"):
            raise UserError(f"drafter lr_schedule must be constant or cosine; got {self.lr_schedule!r}")
        if not 0 <= self.lr_floor <= 1:
            raise UserError(f"drafter lr_floor={self.lr_floor} must lie in [0, 1] (a fraction of lr)")
        if self.epochs < 1 or self.batch_size < 1 or self.lr <= 0:
            raise UserError("drafter epochs, batch_size and lr must be positive")
        if isinstance(self.unroll, bool) or not isinstance(self.unroll, int) or self.unroll < 1:
            raise UserError(f"drafter unroll={self.unroll!r} must be an integer >= 1 (chain steps trained per position)")
        check_layer_indices(self.feature_layers)
        if self.cond_dropout is not None and not (isinstance(self.cond_dropout, (int, float))
                                                  and not isinstance(self.cond_dropout, bool)
                                                  and 0 <= self.cond_dropout < 1):
            raise UserError(f"drafter cond_dropout={self.cond_dropout!r} must lie in [0, 1) (or null: the target's rate)")
        if not 0 < self.val_frac < 1:
            raise UserError(f"drafter val_frac={self.val_frac} must lie in (0, 1)")
        if len(self.betas) != 2 or self.grad_clip <= 0 or self.hidden_noise < 0 or self.ce_weight < 0:
            raise UserError("drafter betas must be two numbers, grad_clip > 0, hidden_noise and ce_weight >= 0")


# -- toy CLIP (lantern.metrics.train_clip) -------------------------------------------------------------------------
@dataclass
class TrainClipParams:
    # architecture: open_clip CLIP, ViT image tower, transformer text tower (BPE vocabulary of open_clip)
    # (a ResNet tower learnt shapes faster than a ViT of similar cost: class-caption accuracy 18 % vs 9 % at 600 steps)
    embed_dim: int = 64
    image_tower: str = "resnet"  # "resnet" (open_clip ModifiedResNet, 4 stages) or "vit"
    patch_size: int = 4  # vit only
    vision_width: int = 16
    vision_layers: int = 1  # resnet: bottleneck blocks per stage; vit: transformer blocks
    text_width: int = 64
    text_layers: int = 2
    head_width: int = 32
    context_length: int = 32  # toy captions with the prefix take <= 20 tokens
    # training
    steps: int = 600
    batch_size: int = 128
    lr: float = 2e-3
    warmup_steps: int = 50
    weight_decay: float = 0.1
    recon_prob: float = 0.5  # chance that a training image is replaced by its VQ reconstruction (needs --vq)
    class_caption_prob: float = 0.3  # chance that a caption is replaced by the class-only caption
    n_val: int = 500  # last n_val images of --data are held out for the retrieval check
    prompt_prefix: str = PROMPT_PREFIX
    seed: int = 0
    threads: int = 0  # torch CPU threads (0: torch's default)

    def __post_init__(self):
        check_threads(self.threads, "train-clip")
        if self.steps < 1 or self.batch_size < 2 or self.n_val < 0:
            raise UserError("train-clip needs steps >= 1, batch_size >= 2 and n_val >= 0")
        if not (0 <= self.recon_prob <= 1 and 0 <= self.class_caption_prob <= 1):
            raise UserError("train-clip recon_prob and class_caption_prob must be in [0, 1]")
        if self.text_width % self.head_width or (self.image_tower == "vit" and self.vision_width % self.head_width):
            raise UserError(f"train-clip text_width (and vision_width of a vit) must be multiples of "
                            f"head_width={self.head_width}")


# -- class classifier (lantern.metrics.train_classifier) -----------------------------------------------------------
@dataclass
class ClassifierParams:
    # defaults chosen on the default toy world (held-out accuracy on originals / VQ reconstructions, trial runs of
    # this recipe on a GPU): width 16 x 2000 steps at lr 3e-3 reached 0.90 / 0.71, width 32 x 2000 0.95 / 0.78,
    # width 24 x 3000 at lr 1e-2 with recon_prob 0.25 0.96 / 0.77 (the shipped CPU run of these defaults: 0.947 /
    # 0.760); recon_prob 0 gave 0.95 / 0.55. The VQ's 8 x 8 tokens lose outlines: reconstructions cap the
    # accuracy, not the classifier's size
    width: int = 24  # channels of the first block (x2, x4 after)
    steps: int = 3000
    batch_size: int = 128
    lr: float = 1e-2  # AdamW, linear warm-up then cosine decay
    warmup_steps: int = 50
    weight_decay: float = 1e-4
    recon_prob: float = 0.25  # chance that a training image is replaced by its VQ reconstruction (needs --vq)
    eval_every: int = 250  # steps between held-out checks in the history
    seed: int = 0
    threads: int = 0  # torch CPU threads (0: torch's default)

    def __post_init__(self):
        check_threads(self.threads, "train-classifier")
        if self.width < 1 or self.steps < 1 or self.batch_size < 2 or self.eval_every < 1:
            raise UserError("train-classifier needs width >= 1, steps >= 1, batch_size >= 2 and eval_every >= 1")
        if not 0 <= self.recon_prob <= 1:
            raise UserError(f"train-classifier recon_prob = {self.recon_prob} must be in [0, 1]")


# -- ambiguity report (lantern.metrics.ambiguity) ------------------------------------------------------------------
@dataclass
class AmbiguityParams:
    cfg_scales: list[float] = field(default_factory=lambda: [1.0, 2.0])
    n_samples: int = 256  # own samples per CFG scale; labels cycle through the classes
    n_heldout: int = 512  # held-out images, teacher-forced
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    batch: int = 64
    seed: int = 0
    n_class_probe: int = 256  # held-out images the target classifies by its likelihoods (--stats-out; 0: skip)

    def __post_init__(self):
        if not self.cfg_scales or any(s < 1 for s in self.cfg_scales):
            raise UserError(f"cfg_scales must be a non-empty list of numbers >= 1, got {self.cfg_scales}")
        if self.n_samples < 0 or self.n_heldout < 0 or self.n_samples + self.n_heldout == 0:
            raise UserError("n_samples and n_heldout must be >= 0 and not both 0")
        if self.n_class_probe < 0:
            raise UserError(f"n_class_probe must be >= 0 (held-out images; 0: skip), got {self.n_class_probe}")

    def sampling(self, cfg: float) -> SamplingParams:
        from lantern.engine.decoding.sampling import SamplingParams

        return SamplingParams(cfg_scale=cfg, temperature=self.temperature, top_k=self.top_k, top_p=self.top_p)
