"""What a run's inputs say, read before any job (`lantern check-config`, and the Snakefile through validate_config).

A job would refuse each of these hours into a run (on a cluster, after the queue): an outdir that cannot hold the
results, a VQ of another downsampling than llamagen.downsample, an empty T5 folder, fewer prompts than images, a
COCO file without annotations, an authors' drafter that is empty or does not fit the target, fewer drafter images
than llamagen.drafter.n_images. Only headers, key lists, file names and counts are read (counts stop at the number
needed): this runs at every start of Snakemake, on a cluster also in every job.
"""

from __future__ import annotations

import os
from pathlib import Path

from lantern.errors import UserError


def check_outdir(cfg: dict) -> None:
    """outdir: a relative or absolute folder that is not empty, not the filesystem root, not inside a file."""
    out = cfg["outdir"]
    if not out.strip():
        raise UserError("config: outdir is empty; set it to the folder for the run's results, e.g. outdir: results")
    where = Path(os.path.abspath(out))
    if where == Path(where.anchor):
        raise UserError(f"config: outdir = {out} is the filesystem root, where the run would write its folders; "
                        "set it to a folder of its own, e.g. outdir: results")
    for p in (where, *where.parents):
        if p.exists() and not p.is_dir():
            inside = "is an existing file" if p == where else f"lies inside the existing file {p}"
            raise UserError(f"config: outdir = {out} {inside}, not a folder; set outdir to a folder path "
                            "(new or existing), e.g. outdir: results")


def _prefixed(key: str, e: UserError, flag: str = "") -> UserError:
    text = str(e).removeprefix(f"{flag} ") if flag else str(e)
    return UserError(f"config: {key}: {text}")


def check_vq_downsample(cfg: dict) -> None:
    """llamagen.downsample against the VQ file (stored VQArgs, or an upstream file's encoder levels): a VQ-16 file
    with downsample 8 (or the reverse) would make token grids of the wrong size."""
    from lantern.engine.models.vq import encoder_levels
    from lantern.worlds.llamagen.upstream import read_vq

    lg = cfg["llamagen"]
    path = lg["vq_ckpt"]
    try:
        args, sd = read_vq(path, mmap=True)
        if not encoder_levels(sd):
            return  # a codebook without its encoder says nothing of the downsampling
        found = args.downsample
    except UserError as e:
        raise _prefixed("llamagen.vq_ckpt", e) from None
    if found != lg["downsample"]:
        side = lg["image_size"] // found
        raise UserError(f"config: llamagen.downsample = {lg['downsample']}, but llamagen.vq_ckpt {path} downsamples by "
                        f"{found}; set llamagen.downsample: {found} ({lg['image_size']} px -> {side} x {side} tokens) "
                        f"or give the VQ-{lg['downsample']} file")


def _target_args(cfg: dict, spec: dict, authors_target: bool = False):
    """The target's ModelArgs from the headers of llamagen.gpt_ckpt: an upstream file, or the authors' HF target
    (folder or weights beside its config.json), read as `lantern convert --kind target` reads it, which the
    convert_target rule runs before any job that loads it."""
    from lantern.worlds.llamagen.hf import read_authors_target
    from lantern.worlds.llamagen.upstream import read_gpt

    path = cfg["llamagen"]["gpt_ckpt"]
    if authors_target:
        try:
            return read_authors_target(path, spec, shapes_only=True)[0]
        except UserError as e:
            raise _prefixed("llamagen.gpt_ckpt", e, "--src") from None
    return read_gpt(path, spec, mmap=True)[0]


def _prompt_rows(cfg: dict) -> list[tuple[str, str]]:
    from lantern.worlds.llamagen.prompts import coco_longest, read_user_prompts

    prompts = cfg["llamagen"]["prompts"]
    key = "llamagen.prompts.file" if prompts["file"] else "llamagen.prompts.coco_captions"
    try:
        if prompts["file"]:
            return read_user_prompts(prompts["file"], key)
        return coco_longest(prompts["coco_captions"], key)
    except UserError as e:
        raise UserError(f"config: {e}") from None


def check_prompts_and_t5(cfg: dict) -> None:
    """A t2i run: enough prompts for sweep.n_images (a COCO file with its annotations), and a T5 folder that holds
    a model (config.json and weights) or a features folder with a file for each of those prompts."""
    rows = _prompt_rows(cfg)
    n = cfg["sweep"]["n_images"]
    prompts = cfg["llamagen"]["prompts"]
    key = "llamagen.prompts.file" if prompts["file"] else "llamagen.prompts.coco_captions"
    if len(rows) < n:
        raise UserError(f"config: sweep.n_images = {n} asks for more prompts than {key} {prompts['file'] or prompts['coco_captions']} "
                        f"holds ({len(rows)}); lower sweep.n_images to <= {len(rows)} or give more prompts")
    t5 = cfg["llamagen"]["t5"]
    if t5["path"]:
        folder = Path(t5["path"])
        if not (folder / "config.json").is_file():
            held = "is empty" if not any(folder.iterdir()) else "has no config.json"
            raise UserError(f"config: llamagen.t5.path = {folder} {held}; point it at a local flan-t5-xl folder "
                            "(config.json, weights, tokenizer)")
        if not any(p.suffix in (".safetensors", ".bin") for p in folder.iterdir()):
            raise UserError(f"config: llamagen.t5.path = {folder} holds no weights (*.safetensors or *.bin); "
                            "download the whole flan-t5-xl folder")
    else:
        from lantern.worlds.llamagen.captions import feature_file

        folder = Path(t5["features"])
        missing = [pid for pid, _ in rows[:n] if not feature_file(folder, pid).is_file()]
        if missing:
            what = "is empty" if not any(folder.iterdir()) else f"lacks {len(missing)} of the {n} prompts' files"
            raise UserError(f"config: llamagen.t5.features = {folder} {what} (first: "
                            f"{feature_file(folder, missing[0]).name}); precompute the features of every prompt, or "
                            "set llamagen.t5.path to encode them")


def check_authors_drafter(cfg: dict, spec: dict, authors_target: bool = False) -> None:
    """The authors' drafter folder or file: its weights present, their keys and shapes those of a drafter for the
    configured target (headers only), which may be the authors' HF target too (`authors_target`)."""
    from lantern.worlds.llamagen.hf import read_authors_drafter

    path = cfg["llamagen"]["authors_drafter"]
    args = _target_args(cfg, spec, authors_target)  # a GPT already checked by validate_config
    try:
        read_authors_drafter(path, args, shapes_only=True)
    except UserError as e:
        raise _prefixed("llamagen.authors_drafter", e, "--src") from None


def _count_class_images(root: Path, limit: int) -> int:
    """Images under the class folders of `root`, counted up to `limit` (an ImageNet train folder holds 1.3 M)."""
    from lantern.worlds.llamagen.images import IMAGE_SUFFIXES

    n = 0
    for d in sorted(p for p in root.iterdir() if p.is_dir()):
        for _, _, names in os.walk(d):
            n += sum(Path(name).suffix.lower() in IMAGE_SUFFIXES for name in names)
            if n >= limit:
                return n
    return n


def check_drafter_images(cfg: dict) -> None:
    """Training a drafter: llamagen.drafter.images holds at least llamagen.drafter.n_images images."""
    from lantern.worlds.llamagen.images import caption_items

    d = cfg["llamagen"]["drafter"]
    root, want = Path(d["images"]), d["n_images"]
    if d["layout"] == "classes":
        if not any(p.is_dir() for p in root.iterdir()):
            raise UserError(f"config: llamagen.drafter.images = {root} has no class folders; layout classes expects "
                            f"{root}/<class>/<image>")
        have = _count_class_images(root, want)
    else:
        try:
            have = len(caption_items(root)[0])
        except UserError as e:
            raise _prefixed("llamagen.drafter.images", e, "--images") from None
    if have < want:
        raise UserError(f"config: llamagen.drafter.n_images = {want} exceeds the {have} images in "
                        f"llamagen.drafter.images {root}; lower llamagen.drafter.n_images to <= {have} or add images")


def check_llamagen_inputs(cfg: dict, source: str, spec: dict, authors_target: bool = False) -> None:
    """Every llamagen-world input file a job would read, after validate_config checked the GPT and VQ; source: where
    the drafter comes from (config.drafter_source), spec: the target as data (config.target_spec), authors_target:
    llamagen.gpt_ckpt is the authors' HF target (config.target_source)."""
    lg = cfg["llamagen"]
    if lg["model_type"] == "t2i":
        check_prompts_and_t5(cfg)
    if not any(m["name"] != "vanilla" for m in cfg["sweep"]["methods"]):
        return
    if source == "authors":
        check_authors_drafter(cfg, spec, authors_target)
    elif source == "train":
        check_drafter_images(cfg)


# -- the Chameleon-family world ---------------------------------------------------------------------------------------
PROMPT_SETS = {"coco_captions": "MS-COCO captions_val2017.json", "caption_list": "captions_val2017_longest.json",
               "tsv": "PartiPrompts.tsv / SJDPrompts.tsv"}


def chameleon_prompt_set(cfg: dict) -> tuple[str, str]:
    """(config key, path) of the prompt set a Chameleon run reads; ("chameleon.prompts.sjd", "") for SJDPrompts,
    which ship with the code. One set, so that row i always captions image i of every point."""
    prompts = cfg["chameleon"]["prompts"]
    given = [k for k in PROMPT_SETS if prompts.get(k)] + (["sjd"] if prompts.get("sjd") else [])
    if len(given) > 1:
        raise UserError(f"config: chameleon.prompts sets {' and '.join(given)}; keep one prompt set")
    if not given:
        raise UserError("config: chameleon.prompts names no prompt set; set coco_captions (the authors' run.sh), "
                        "caption_list, tsv, or sjd: true")
    return f"chameleon.prompts.{given[0]}", prompts[given[0]] if given[0] != "sjd" else ""


def chameleon_files(cfg: dict) -> list[tuple[str, str, str]]:
    """(config key, path, "file" or "folder") of every input a Chameleon run reads: the family's released files,
    its prompt set, and the metrics' weights and real images."""
    ch, m = cfg["chameleon"], cfg["metrics"]
    drafted = any(x["name"] != "vanilla" and x.get("drafting", "chain") != "jacobi" for x in cfg["sweep"]["methods"])
    yaml_path = ch["vqgan_yaml"] or (str(Path(ch["vqgan_ckpt"]).with_name("vqgan.yaml")) if ch["vqgan_ckpt"] else "")
    files = [("chameleon.target", ch["target"], "folder"), ("chameleon.vqgan_ckpt", ch["vqgan_ckpt"], "file"),
             ("chameleon.vqgan_yaml", yaml_path, "file"), ("chameleon.tokenizer", ch["tokenizer"], "file")]
    key, path = chameleon_prompt_set(cfg)
    if path:
        files.append((key, path, "file"))
    if drafted:
        files.insert(1, ("chameleon.drafter", ch["drafter"], "folder"))
    files.append(("metrics.reference", m["reference"], "folder" if not m["reference"].endswith(".npz") else "file"))
    if m["fid_extractor"] == "inception-v3-compat":
        files.append(("metrics.inception_weights", m["inception_weights"], "file"))
    if m["vgg16_weights"]:
        files.append(("metrics.vgg16_weights", m["vgg16_weights"], "file"))
    if m["clip_model"] != "toy":
        files.append(("metrics.clip_ckpt", m["clip_ckpt"], "file"))
    if m["hpsv2"]["enabled"]:
        files.append(("metrics.hpsv2.weights_path", m["hpsv2"]["weights_path"], "file"))
    return files


def check_chameleon_inputs(cfg: dict) -> None:
    """Names every missing input of a Chameleon run, one line each, and refuses when any is missing; then checks
    that the prompt set holds sweep.n_images prompts."""
    missing = []
    for key, path, kind in chameleon_files(cfg):
        there = bool(path) and (Path(path).is_dir() if kind == "folder" else Path(path).is_file())
        if not there:
            missing.append(f"  {key}: {kind} {path} does not exist" if path else f"  {key} is empty; set it")
    if missing:
        raise UserError("\n".join([f"config: world chameleon ({cfg['chameleon']['family']}): {len(missing)} input(s) "
                                   "to place (or fix the paths):", *missing]))
    from lantern.worlds.chameleon.prompts import prompt_set

    key, path = chameleon_prompt_set(cfg)
    try:
        rows = prompt_set(key.rsplit(".", 1)[1], path, f"config: {key}")
    except UserError as e:
        raise UserError(str(e) if str(e).startswith("config: ") else f"config: {e}") from None
    n = cfg["sweep"]["n_images"]
    if len(rows) < n:
        raise UserError(f"config: sweep.n_images = {n} asks for more prompts than {key} {path or '(SJDPrompts)'} "
                        f"holds ({len(rows)}); lower sweep.n_images to <= {len(rows)} or give more prompts")


def check_chameleon_methods(cfg: dict, points: dict[str, dict]) -> None:
    """A family whose layout forces structural tokens (Lumina-mGPT) runs only the methods the engine runs under a
    layout (engine/decoding/kinds.layout_supported / layout_refusal, asked here): any other point is one line naming it."""
    if cfg["chameleon"]["family"] != "lumina-mgpt":
        return  # Anole: codes only, every method runs
    from lantern.engine.decoding import kinds
    from lantern.engine.methods import drafting, speculative

    compile = cfg["compile"] is True  # auto runs a layout's speculative rounds eager
    for name, spec in points.items():
        if speculative(spec) and not kinds.layout_supported(drafting(spec), compile):
            why = kinds.layout_refusal(drafting(spec), compile) or "the engine refuses it"
            raise UserError(f"config: sweep point {name} does not run under Lumina-mGPT's layout (forced structural "
                            f"tokens): {why}; or drop it from sweep.methods (docs/chameleon-layout.md)")
