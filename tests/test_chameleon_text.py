"""Chameleon's vocabulary and prompts on a tokenizer.json built here with the `tokenizers` package: the real id
layout (ids 0-3 special, IMGIMG names at 4..8195, <eoss> 8196, <racm3:break> 8197, <reserved{k}> at k + 4 up to
id 8843) plus a few text words. The code <-> id map against transformers' own name parser, its failing check on a
shuffled vocabulary, both families' templates, and the prompt sets."""

import json
import random

import pytest
import torch
from tokenizers import AddedToken, Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace

from lantern.errors import UserError
from lantern.worlds.chameleon import prompts as cp
from lantern.worlds.chameleon.tokenizer import code_of_name, load_vocab, name_of_code, vocab_from_mapping

CODES = 8192
WORDS = ["Generate", "an", "image", "of", "768x768", "according", "to", "the", "following", "prompt", ":", "a",
         "red", "cat", "on", "mat", ","]


def chameleon_vocab(shuffle_images=False) -> dict[str, int]:
    names = ["<s>", "<pad>", "</s>", "<unk>"] + [name_of_code(c) for c in range(CODES)] + ["<eoss>", "<racm3:break>"]
    names += [f"<reserved{k:05d}>" for k in range(len(names) - 4, 8840)]  # reserved k at id k + 4
    vocab = {n: i for i, n in enumerate(names)}
    if shuffle_images:
        ids = [vocab[name_of_code(c)] for c in range(CODES)]
        random.Random(0).shuffle(ids)
        vocab.update({name_of_code(c): i for c, i in zip(range(CODES), ids)})
    vocab.update({w: len(names) + j for j, w in enumerate(WORDS)})
    return vocab


def write_tokenizer(path, vocab, added=True):
    tok = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = Whitespace()
    if added:  # the structural and reserved tokens are added (special) tokens in Chameleon's files
        tok.add_special_tokens([AddedToken(n, special=True) for n in vocab if n.startswith("<")])
    tok.save(str(path))
    return path


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory):
    return write_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer.json", chameleon_vocab())


def test_layout_of_the_test_vocabulary_is_the_released_one():
    v = chameleon_vocab()
    assert (v["<eoss>"], v["<racm3:break>"], v["<reserved08706>"], v["<reserved08799>"], v["<reserved08824>"]) == \
        (8196, 8197, 8710, 8803, 8828)


def test_code_names_agree_with_transformers(tokenizer_file):
    from transformers.models.chameleon.modeling_chameleon import ChameleonImageVocabularyMapping

    tok, vocab = load_vocab(tokenizer_file)
    assert vocab.num_codes == CODES and vocab.size == 8844 + len(WORDS)
    hf = ChameleonImageVocabularyMapping(tok.get_vocab()).bpe2img  # token id -> code, from the names
    assert all(code_of_name(name_of_code(c)) == c for c in range(CODES))
    assert hf == {c + 4: c for c in range(CODES)}
    codes = torch.randint(0, CODES, (3, 7))
    ids = vocab.code_to_id(codes)
    assert torch.equal(ids, codes + 4) and torch.equal(vocab.id_to_code(ids), codes)
    assert [hf[i] for i in ids.flatten().tolist()] == codes.flatten().tolist()
    with pytest.raises(ValueError, match="outside the image tokens"):
        vocab.id_to_code(torch.tensor([8197]))
    assert code_of_name("IMGIMGZ") is None and code_of_name("IMGIMGKZ") is None and code_of_name("<s>") is None


def test_shuffled_or_gappy_vocabulary_fails_at_load(tmp_path):
    path = write_tokenizer(tmp_path / "tokenizer.json", chameleon_vocab(shuffle_images=True))
    with pytest.raises(UserError, match=r"puts image code \d+ \(IMGIMG\w+Z\) at id \d+, not \d+ \(code \+ 4\)") as e:
        load_vocab(path)
    assert "\n" not in str(e.value) and str(path) in str(e.value)
    gap = {n: i for n, i in chameleon_vocab().items() if n != name_of_code(5)}
    with pytest.raises(UserError, match="lacks image code 5"):
        vocab_from_mapping(gap, "gap.json")
    moved = dict(chameleon_vocab(), **{"<racm3:break>": 8200, "<reserved08196>": 8197})
    with pytest.raises(UserError, match="<racm3:break> at id 8200, not 8197"):
        vocab_from_mapping(moved, "moved.json")
    with pytest.raises(UserError, match="no image tokens"):
        vocab_from_mapping({"<s>": 0, "a": 1}, "text.json")
    with pytest.raises(UserError, match="does not exist"):
        load_vocab(tmp_path / "none.json")
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(UserError, match="not a tokenizers JSON"):
        load_vocab(tmp_path / "bad.json")


def test_both_templates(tokenizer_file):
    tok, vocab = load_vocab(tokenizer_file.parent)  # the folder form finds tokenizer.json
    v = chameleon_vocab()
    words = [v[w] for w in ("a", "red", "cat", "on", "the", "mat")]
    assert cp.prompt_ids("anole", "a red cat on the mat", tok, vocab) == [0] + words + [8710, 8197]
    assert cp.uncond_ids("anole", vocab) == [0, 8197]
    header = [v[w] for w in ("Generate", "an", "image", "of", "768x768", "according", "to", "the", "following",
                             "prompt", ":")]
    assert cp.prompt_ids("lumina-mgpt", "a red cat on the mat", tok, vocab) == \
        [0] + header + words + [8710] + [8197, 8828, 8828]
    assert cp.uncond_ids("lumina-mgpt", vocab, tok) == [8197, 8828, 8828]
    assert cp.size_id(tok, vocab, 512) == 8820 and cp.size_id(tok, vocab, 1024) == 8836
    with pytest.raises(UserError, match="unknown Chameleon family"):
        cp.prompt_ids("chameleon", "a", tok, vocab)


def test_end_of_turn_must_be_one_token(tmp_path):
    tok, vocab = load_vocab(write_tokenizer(tmp_path / "t.json", chameleon_vocab(), added=False))
    assert cp.prompt_ids("anole", "a cat", tok, vocab)[-2:] == [8710, 8197]  # Anole appends the ids itself
    with pytest.raises(UserError, match="does not read <reserved08706> as the single token 8710"):
        cp.prompt_ids("lumina-mgpt", "a cat", tok, vocab)


def test_prompt_sets(tmp_path):
    tsv = tmp_path / "PartiPrompts.tsv"
    tsv.write_text('Prompt\tCategory\tChallenge\tNote\nA "quoted" cat, sitting\tAnimals\tSimple\t\n'
                   "bond\tAbstract\tBasic\tnote\n", encoding="utf-8")
    assert cp.read_prompt_tsv(tsv) == [("0", 'A "quoted" cat, sitting'), ("1", "bond")]
    (tmp_path / "no.tsv").write_text("Caption\nx\n")
    with pytest.raises(UserError, match="no Prompt column"):
        cp.read_prompt_tsv(tmp_path / "no.tsv")
    sjd = tmp_path / "SJDPrompts.tsv"
    sjd.write_text("Prompt\n" + "\n".join(cp.SJD_PROMPTS) + "\n", encoding="utf-8")
    assert cp.read_prompt_tsv(sjd) == cp.sjd_prompts() and len(cp.sjd_prompts()) == 10
    captions = ["A dog sitting on a footstool\n", "A cat. "]  # kept verbatim
    (tmp_path / "longest.json").write_text(json.dumps(captions))
    assert cp.read_caption_list(tmp_path / "longest.json") == [("0", captions[0]), ("1", captions[1])]
    (tmp_path / "coco.json").write_text(json.dumps({"annotations": []}))
    with pytest.raises(UserError, match="lantern prompts --coco"):
        cp.read_caption_list(tmp_path / "coco.json")
    with pytest.raises(UserError, match="does not exist"):
        cp.read_caption_list(tmp_path / "none.json")


def test_size_token_must_exist(tokenizer_file):
    tok, vocab = load_vocab(tokenizer_file)
    with pytest.raises(UserError, match="no size token <reserved08864> for 2048 px"):
        cp.size_id(tok, vocab, 2048)
    with pytest.raises(UserError, match="not a multiple of 32"):
        cp.size_id(tok, vocab, 500)
