"""A tiny random T5 encoder and tokenizer in the layout of a local flan-t5 folder, built offline.

`write_tiny_t5(folder)` saves config.json + model.safetensors (T5EncoderModel, gated-GELU like FLAN-T5) and
tokenizer.json + tokenizer_config.json (a unigram model trained here on a few sentences, with T5's special ids:
<pad> 0, </s> 1, <unk> 2, and </s> appended to every text). Its features are TINY_T5_DIM wide: the caption_dim of
a tiny t2i GPT that reads them (upstream's flan-t5-xl gives 2048).
"""
from pathlib import Path

import torch

TINY_T5_DIM = 32
SENTENCES = [
    "a cat sits on a mat", "two dogs run in the park", "a red bus drives down a busy street",
    "a plate of food on a wooden table", "a man rides a horse near the river", "a bowl of fruit and a cup of coffee",
    "people walking in the snow with umbrellas", "a train stops at a station in the city",
]


def write_tiny_t5(folder, seed: int = 0) -> Path:
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast, T5Config, T5EncoderModel
    from transformers.utils import logging

    logging.disable_progress_bar()
    folder = Path(folder)
    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(SENTENCES, trainers.UnigramTrainer(
        vocab_size=120, special_tokens=["<pad>", "</s>", "<unk>"], unk_token="<unk>"))
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", pair="$A </s> $B </s>",
                                                       special_tokens=[("</s>", 1)])
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>",
                            model_max_length=512).save_pretrained(folder)
    config = T5Config(vocab_size=tok.get_vocab_size(), d_model=TINY_T5_DIM, d_kv=8, d_ff=64, num_layers=2,
                      num_heads=4, feed_forward_proj="gated-gelu", pad_token_id=0, eos_token_id=1,
                      is_encoder_decoder=False, use_cache=False)
    torch.manual_seed(seed)
    T5EncoderModel(config).save_pretrained(folder)
    return folder
